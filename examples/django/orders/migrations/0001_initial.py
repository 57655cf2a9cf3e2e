from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
                ("customer", models.CharField(max_length=100)),
                ("total_cents", models.IntegerField()),
                ("job_id", models.CharField(blank=True, max_length=64)),
                ("checked", models.BooleanField(default=False)),
            ],
        ),
    ]
