from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tenantcol", "0001_initial")]

    # A NOT NULL column with a default: PostgreSQL 11+ adds it without rewriting the table.
    operations = [migrations.AddField(model_name="benchnote", name="flag", field=models.BooleanField(default=False))]
