"""Settings: each ``JOBS_*`` setting declared once (:mod:`~jobs._config.setting_options`),
read and validated into a frozen :class:`~jobs._config.settings.Settings`, and the database
and broker URLs they name.

Private: applications read settings through ``jobs.default_app().settings``.
"""
