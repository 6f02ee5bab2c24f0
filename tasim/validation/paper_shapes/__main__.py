from tasim.validation.paper_shapes.cli import main

main()
