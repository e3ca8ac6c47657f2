from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0003_staff_action_permissions'),
    ]

    operations = [
        # The plaintext columns keep their names in the table (old processes still write
        # them during a deploy); the model reaches them under names that say what they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RenameField(model_name='webhookendpoint', old_name='secret', new_name='secret_plaintext'),
                migrations.RenameField(model_name='webhookendpoint', old_name='previous_secret', new_name='previous_secret_plaintext'),
                migrations.AlterField(
                    model_name='webhookendpoint',
                    name='secret_plaintext',
                    field=models.CharField(blank=True, db_column='secret', default='', editable=False, max_length=80),
                ),
                migrations.AlterField(
                    model_name='webhookendpoint',
                    name='previous_secret_plaintext',
                    field=models.CharField(blank=True, db_column='previous_secret', default='', editable=False, max_length=80),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name='webhookendpoint',
            name='secret_sealed',
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='webhookendpoint',
            name='previous_secret_sealed',
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
    ]
