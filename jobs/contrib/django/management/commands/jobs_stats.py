"""``manage.py jobs_stats``: ``jobctl stats`` with the project's settings."""

from jobs.contrib.django.management.commands._jobctl import JobctlCommand


class Command(JobctlCommand):
    help = "jobctl stats with this project's settings (settings.JOBS; JOBS_* variables win)"
    jobctl_command = "stats"
