from lab.paper_shapes.command import main

main()
