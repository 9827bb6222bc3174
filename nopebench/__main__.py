from nopebench.cli import main

main()
