from specdec.cli.commands import main

main()
