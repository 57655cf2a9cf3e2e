"""``manage.py jobs_worker``: ``jobctl worker`` with the project's settings."""

from jobs.contrib.django.management.commands._jobctl import JobctlCommand


class Command(JobctlCommand):
    help = "jobctl worker with this project's settings (settings.JOBS; JOBS_* variables win)"
    jobctl_command = "worker"
