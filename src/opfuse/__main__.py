from opfuse.cli import main

main()
