from starttrace.cli import main

main()
