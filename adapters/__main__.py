from adapters.cli import main

main()
