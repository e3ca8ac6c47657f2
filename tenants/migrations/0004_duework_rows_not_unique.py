"""DueWork without a unique key on (tenant, kind): writers that find no row each insert
their own instead of waiting for another's uncommitted insert (tenants/duework.py).

The table holds only markers of work that is due, rebuilt by the work itself: it is
dropped and made again rather than altered (its primary key changes). Markers lost this
way are found by the safety sweep, which visits every tenant."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0003_duework'),
    ]

    operations = [
        migrations.DeleteModel(name='DueWork'),
        migrations.CreateModel(
            name='DueWork',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('relay', 'Relay: events or deliveries due now'), ('relay_later', 'Relay: next retry'), ('topups', 'Top-up recovery')], max_length=16)),
                ('due_at', models.DateTimeField()),
                ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.tenant', to_field='schema_name')),
            ],
            options={
                'indexes': [models.Index(fields=['tenant', 'kind'], name='duework_tenant_kind'), models.Index(fields=['due_at'], name='duework_due_at')],
            },
        ),
    ]
