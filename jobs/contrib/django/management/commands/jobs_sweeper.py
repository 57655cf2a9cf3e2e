"""``manage.py jobs_sweeper``: ``jobctl sweeper`` with the project's settings."""

from jobs.contrib.django.management.commands._jobctl import JobctlCommand


class Command(JobctlCommand):
    help = "jobctl sweeper with this project's settings (settings.JOBS; JOBS_* variables win)"
    jobctl_command = "sweeper"
