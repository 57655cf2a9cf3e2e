from jobs.cli import main

main(prog_name="jobctl")
