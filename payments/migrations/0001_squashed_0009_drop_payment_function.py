"""payments 0001-0009 squashed (`manage.py squashmigrations payments 0009`).

The PL/pgSQL payment functions that 0002, 0004 and 0007 created were dropped by 0009, when
the payment path moved into Python (payments/services/charges.py): those RunSQL
operations were marked elidable before squashing, so a new schema never creates them.
What still exists is here: the tables, their CHECK and unique constraints and indexes, and
the removal of the `*_like` indexes on the hot tables' char ids (0006).

A database migrated with the old chain has 0001-0009 recorded as applied; Django then
records this migration as applied too (`replaces`) and runs nothing, though the replaced
files are gone. tests/tools/payments_squash_proof.py shows both schemas are the same. A
database stopped part-way through 0001-0009 must first migrate with a release that still
has them (any release before the squash).
"""

from typing import Any

import django.db.migrations.operations.special
import django.db.models.deletion
import django.utils.timezone
import payments.models
import wallets.ids
from django.db import migrations, models

# 0006: ids are only ever looked up by equality, so the varchar_pattern_ops indexes Django
# adds to char primary keys and indexed char columns serve no query; on the tables every
# payment inserts into they cost one index insertion each.
HOT_COLUMNS = [
    ("payments_payment", "id"),
    ("payments_outboxevent", "id"),
    ("wallets_ledgertransaction", "id"),
    ("wallets_ledgerentry", "transaction_id"),
]


def deferred_sql_apply(apps: Any, schema_editor: Any) -> None:
    """Create now the foreign keys and indexes Django defers to the end of a migration, as
    the end of 0001 did: the operations of 0003 and 0005 below drop some of them, which
    only works once they exist (in one migration they would be created after the drops)."""
    for statement in schema_editor.deferred_sql:
        schema_editor.execute(statement)
    schema_editor.deferred_sql.clear()


def drop_like_indexes(apps: Any, schema_editor: Any) -> None:
    for table, column in HOT_COLUMNS:
        name = schema_editor._create_index_name(table, [column], suffix="_like")
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):

    replaces = [('payments', '0001_initial'), ('payments', '0002_payment_hot_path'), ('payments', '0003_payment_hot_path_indexes'), ('payments', '0004_payment_hot_path_fewer_statements'), ('payments', '0005_payment_no_hot_fks'), ('payments', '0006_drop_pattern_indexes_on_hot_tables'), ('payments', '0007_payment_hot_path_caller_clock'), ('payments', '0008_payment_token_single_use'), ('payments', '0009_drop_payment_function')]

    initial = True

    dependencies = [
        ('wallets', '0003_ledger_append_only'),
        ('wallets', '0004_ledger_hot_path_indexes'),
        ('wallets', '0005_ledger_no_hot_fks'),
    ]

    operations = [
        migrations.CreateModel(
            name='OutboxEvent',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_event_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('topic', models.CharField(max_length=100)),
                ('payload', models.JSONField()),
                ('created', models.DateTimeField(default=django.utils.timezone.now)),
                ('published_at', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True, default='')),
            ],
            options={
                'ordering': ['created', 'id'],
                'indexes': [models.Index(condition=models.Q(('published_at__isnull', True)), fields=['created', 'id'], name='outbox_unpublished')],
            },
        ),
        migrations.CreateModel(
            name='Payment',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_payment_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('status', models.CharField(choices=[('succeeded', 'Succeeded')], default='succeeded', max_length=12)),
                ('amount', models.BigIntegerField()),
                ('amount_refunded', models.BigIntegerField(default=0)),
                ('points_earned', models.BigIntegerField(default=0)),
                ('points_reversed', models.BigIntegerField(default=0)),
                ('carbon_grams', models.BigIntegerField(default=0)),
                ('carbon_grams_reversed', models.BigIntegerField(default=0)),
                ('created', models.DateTimeField(default=django.utils.timezone.now)),
                ('asset', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset')),
                ('customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.customer')),
                ('ledger_transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
                ('merchant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.merchant')),
                ('store', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.store')),
                ('terminal', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.terminal')),
            ],
            options={
                'ordering': ['-created', '-id'],
            },
        ),
        migrations.CreateModel(
            name='PaymentIntent',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_payment_intent_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('amount', models.BigIntegerField()),
                ('amount_captured', models.BigIntegerField(default=0)),
                ('capture_method', models.CharField(choices=[('automatic', 'Automatic'), ('manual', 'Manual')], default='automatic', max_length=10)),
                ('status', models.CharField(choices=[('created', 'Created'), ('charge_requested', 'Charge requested'), ('charged', 'Charged'), ('charge_failed', 'Charge failed'), ('authorized', 'Authorized (funds held)'), ('captured', 'Captured'), ('canceled', 'Canceled')], default='created', max_length=20)),
                ('version', models.PositiveIntegerField(default=1)),
                ('failure_code', models.CharField(blank=True, default='', max_length=50)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('updated', models.DateTimeField(auto_now=True)),
                ('asset', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset')),
                ('customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payment_intents', to='wallets.customer')),
                ('hold', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payment_intent', to='wallets.hold')),
                ('merchant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payment_intents', to='wallets.merchant')),
                ('payment', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payment_intent', to='payments.payment')),
            ],
            options={
                'ordering': ['-created', '-id'],
            },
        ),
        migrations.CreateModel(
            name='PaymentToken',
            fields=[
                ('id', models.CharField(default=payments.models.new_payment_token_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('token_hash', models.CharField(max_length=64, unique=True)),
                ('expires_at', models.DateTimeField()),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payment_tokens', to='wallets.customer')),
            ],
            options={
                'ordering': ['-created'],
            },
        ),
        migrations.CreateModel(
            name='Refund',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_refund_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('status', models.CharField(default='succeeded', max_length=12)),
                ('amount', models.BigIntegerField()),
                ('reason', models.CharField(blank=True, default='', max_length=500)),
                ('points_reversed', models.BigIntegerField(default=0)),
                ('carbon_grams_reversed', models.BigIntegerField(default=0)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('ledger_transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
                ('payment', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='refunds', to='payments.payment')),
            ],
            options={
                'ordering': ['-created', '-id'],
            },
        ),
        migrations.CreateModel(
            name='TopUp',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_topup_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('status', models.CharField(choices=[('pending', 'Pending (waiting for the PSP)'), ('succeeded', 'Succeeded (credited)'), ('failed', 'Failed')], default='pending', max_length=10)),
                ('amount', models.BigIntegerField()),
                ('bonus_amount', models.BigIntegerField(default=0)),
                ('payment_method', models.CharField(max_length=100)),
                ('psp_reference', models.CharField(blank=True, default='', max_length=200)),
                ('failure_code', models.CharField(blank=True, default='', max_length=50)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('updated', models.DateTimeField(auto_now=True)),
                ('asset', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset')),
                ('customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='topups', to='wallets.customer')),
                ('ledger_transaction', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
            ],
            options={
                'ordering': ['-created', '-id'],
            },
        ),
        migrations.CreateModel(
            name='Transfer',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_transfer_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('status', models.CharField(default='succeeded', max_length=12)),
                ('amount', models.BigIntegerField()),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('asset', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset')),
                ('from_customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='transfers_out', to='wallets.customer')),
                ('ledger_transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
                ('to_customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='transfers_in', to='wallets.customer')),
            ],
            options={
                'ordering': ['-created', '-id'],
            },
        ),
        migrations.CreateModel(
            name='Adjustment',
            fields=[
                ('id', models.CharField(default=wallets.ids.new_adjustment_id, editable=False, max_length=32, primary_key=True, serialize=False)),
                ('amount', models.BigIntegerField()),
                ('direction', models.CharField(choices=[('credit', 'Credit'), ('debit', 'Debit')], max_length=6)),
                ('reason', models.CharField(max_length=500)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('asset', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset')),
                ('customer', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='adjustments', to='wallets.customer')),
                ('ledger_transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction')),
                ('merchant', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='adjustments', to='wallets.merchant')),
                ('staff', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='adjustments', to='wallets.staffmember')),
            ],
            options={
                'ordering': ['-created', '-id'],
                'constraints': [models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='adjustment_amount_positive'), models.CheckConstraint(condition=models.Q(models.Q(('customer__isnull', False), ('merchant__isnull', True)), models.Q(('customer__isnull', True), ('merchant__isnull', False)), _connector='OR'), name='adjustment_one_party')],
            },
        ),
        migrations.AddIndex(
            model_name='payment',
            index=models.Index(fields=['merchant', '-created', '-id'], name='payment_merchant_created'),
        ),
        migrations.AddIndex(
            model_name='payment',
            index=models.Index(fields=['terminal', '-created', '-id'], name='payment_terminal_created'),
        ),
        migrations.AddIndex(
            model_name='payment',
            index=models.Index(fields=['customer', '-created', '-id'], name='payment_customer_created'),
        ),
        migrations.AddConstraint(
            model_name='payment',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='payment_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='payment',
            constraint=models.CheckConstraint(condition=models.Q(('amount_refunded__gte', 0), ('amount_refunded__lte', models.F('amount'))), name='payment_refunded_bounded'),
        ),
        migrations.AddConstraint(
            model_name='payment',
            constraint=models.CheckConstraint(condition=models.Q(('points_reversed__gte', 0), ('points_reversed__lte', models.F('points_earned'))), name='payment_points_bounded'),
        ),
        migrations.AddConstraint(
            model_name='payment',
            constraint=models.CheckConstraint(condition=models.Q(('carbon_grams_reversed__gte', 0), ('carbon_grams_reversed__lte', models.F('carbon_grams'))), name='payment_carbon_bounded'),
        ),
        migrations.AddIndex(
            model_name='paymentintent',
            index=models.Index(fields=['merchant', '-created', '-id'], name='intent_merchant_created'),
        ),
        migrations.AddConstraint(
            model_name='paymentintent',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='intent_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='paymentintent',
            constraint=models.CheckConstraint(condition=models.Q(('amount_captured__gte', 0), ('amount_captured__lte', models.F('amount'))), name='intent_captured_bounded'),
        ),
        migrations.AddConstraint(
            model_name='refund',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='refund_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='topup',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='topup_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='topup',
            constraint=models.CheckConstraint(condition=models.Q(('bonus_amount__gte', 0)), name='topup_bonus_non_negative'),
        ),
        migrations.AddConstraint(
            model_name='topup',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('ledger_transaction__isnull', False), ('status', 'succeeded')), models.Q(('status', 'succeeded'), _negated=True), _connector='OR'), name='topup_succeeded_has_ledger'),
        ),
        migrations.AddConstraint(
            model_name='transfer',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='transfer_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='transfer',
            constraint=models.CheckConstraint(condition=models.Q(('from_customer', models.F('to_customer')), _negated=True), name='transfer_not_to_self'),
        ),
        # -- end of 0001 --
        migrations.RunPython(code=deferred_sql_apply, reverse_code=django.db.migrations.operations.special.RunPython.noop),
        migrations.RemoveIndex(
            model_name='payment',
            name='payment_terminal_created',
        ),
        migrations.AlterField(
            model_name='payment',
            name='asset',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.asset'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='customer',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.customer'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='ledger_transaction',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='merchant',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.merchant'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='store',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.store'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='terminal',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.terminal'),
        ),
        migrations.AddIndex(
            model_name='payment',
            index=models.Index(fields=['store', '-created', '-id'], name='payment_store_created'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='customer',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='wallets.customer'),
        ),
        migrations.AlterField(
            model_name='payment',
            name='ledger_transaction',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='wallets.ledgertransaction'),
        ),
        migrations.RunPython(
            code=drop_like_indexes,
            reverse_code=django.db.migrations.operations.special.RunPython.noop,
        ),
        migrations.AddField(
            model_name='paymenttoken',
            name='used_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
