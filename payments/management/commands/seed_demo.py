from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from payments.demo import demo_seed


class Command(BaseCommand):
    help = "Create the demo tenant (idempotent) and print its logins and API keys."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        result = demo_seed()
        if options["json"]:
            self.stdout.write(json.dumps(result))
            return
        self.stdout.write("demo tenant ready")
