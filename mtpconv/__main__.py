from mtpconv.cli import main

main()
