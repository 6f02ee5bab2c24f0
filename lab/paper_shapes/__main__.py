from lab.paper_shapes.cli import main

main()
