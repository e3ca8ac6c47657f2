"""Every event says which object it is about and where it falls among that object's
events (`object_id`, `sequence`), because deliveries go in no order and receivers order
an object's events themselves. Both columns have constant defaults in the database (no
table rewrite), so the code before this one keeps inserting events during the deploy;
events written before this keep sequence 0. The index is built CONCURRENTLY: payments
keep writing events meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("payments", "0019_admin_names")]

    operations = [
        migrations.AddField(model_name="outboxevent", name="object_id", field=models.CharField(blank=True, default="", db_default="", max_length=32)),
        migrations.AddField(model_name="outboxevent", name="sequence", field=models.PositiveIntegerField(default=0, db_default=0)),
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(fields=["object_id", "-sequence"], condition=~models.Q(object_id=""), name="outbox_object_sequence"),
        ),
    ]
