from django.db import models


class BenchNote(models.Model):
    text = models.CharField(max_length=50, default="")

    class Meta:
        app_label = "tenantcol"
