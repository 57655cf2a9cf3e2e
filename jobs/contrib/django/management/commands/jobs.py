"""``manage.py jobs <command> [options]``: any ``jobctl`` command with the project's settings."""

from jobs.contrib.django.management.commands._jobctl import JobctlCommand


class Command(JobctlCommand):
    help = (
        "jobctl <command> with this project's settings (settings.JOBS and DATABASES; JOBS_* "
        "variables win): list, show, explain, retry, cancel, approve, limits, worker, "
        "sweeper ... (manage.py jobs --help lists them)"
    )
