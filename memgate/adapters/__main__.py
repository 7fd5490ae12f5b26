from memgate.adapters.cli import main

main()
