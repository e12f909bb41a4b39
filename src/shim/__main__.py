from shim.cli import main

main()
