"""Recovery that does not depend on the broker: the sweeper (expired leases, dead owners,
lost doorbells), periodic schedules' ticks, the broker queue's health, and the Prometheus
metrics read from the job tables. Private: run by ``jobctl sweeper``.
"""
