from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total_cents = models.IntegerField()
    job_id = models.CharField(max_length=64, blank=True)
    checked = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer}"
