"""Customer contact data (email, phone): encrypted at rest, found by a keyed hash, masked
in logs and the admin; and the staged migration `customer_contacts` that moves it there.

  old  the plaintext columns (`CustomerLegacyContact`), until contract drops them;
  new  Fernet tokens (MultiFernet over TALLY_CONTACT_ENCRYPTION_KEYS, newest key first)
       and an HMAC-SHA256 of the normalised email (TALLY_CONTACT_HASH_KEY).

By the tenant's phase:
  absent                  write old; read old
  expanded .. verified    write both (one transaction); read old; lookups read both
  reads_switched          write both; read new (old for a field not written yet)
  contracting/contracted  write new; read new

A new tenant starts at `contracted` (`customer_contacts_new_tenant`): it never writes the
plaintext columns (they stay, empty). A NULL ciphertext column is absent (the backfill fills it); the token of "" is an
explicitly cleared value, which the backfill never overwrites.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from typing import Any, Final

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet

from wallets.locks import customer_rows_lock
from wallets.models import Customer, CustomerLegacyContact
from wallets.staged.phases import reads_new, staged_phase, writes_new, writes_old
from wallets.staged.runner import staged_start_contracted
from wallets.staged.spec import BatchResult, StagedMigration, StagedMigrationRefused, VerifyReport, discard_in_batches, verify_snapshot

logger = logging.getLogger("tally.contacts")

MIGRATION: Final = "customer_contacts"
_NEW_COLUMNS: Final = ("email_ciphertext", "phone_ciphertext", "email_hash")


class Unset:
    def __repr__(self) -> str:
        return "UNSET"


# "Leave this field as it is", distinct from None / "" ("clear it").
UNSET: Final = Unset()


@dataclass(frozen=True)
class Contact:
    email: str
    phone: str


@functools.lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise RuntimeError("TALLY_CONTACT_ENCRYPTION_KEYS is empty")
    return MultiFernet([Fernet(key.encode()) for key in keys])


def _contact_fernet() -> MultiFernet:
    return _fernet(tuple(settings.TALLY_CONTACT_ENCRYPTION_KEYS))


def contact_encrypt(value: str) -> str:
    """A Fernet token of `value` under the newest key."""
    return _contact_fernet().encrypt(value.encode("utf-8")).decode("ascii")


def contact_decrypt(token: str) -> str:
    """The value of a token made under any configured key (raises InvalidToken otherwise)."""
    return _contact_fernet().decrypt(token.encode("ascii")).decode("utf-8")


def contact_rotate(token: str) -> str | None:
    """The token re-encrypted under the newest key, or None if it already is."""
    keys = tuple(settings.TALLY_CONTACT_ENCRYPTION_KEYS)
    try:
        Fernet(keys[0].encode()).decrypt(token.encode("ascii"))
        return None
    except InvalidToken:
        return _fernet(keys).rotate(token.encode("ascii")).decode("ascii")


def email_normalise(email: str) -> str:
    return email.strip().lower()


def email_lookup_hash(email: str) -> str | None:
    """The keyed hash lookups use; None for no email."""
    normalised = email_normalise(email)
    if not normalised:
        return None
    key = str(settings.TALLY_CONTACT_HASH_KEY).encode("utf-8")
    return hmac.new(key, normalised.encode("utf-8"), hashlib.sha256).hexdigest()


_EMAIL = re.compile(r"^(.)(.*)(@.*)$")


def mask_email(value: str | None) -> str | None:
    """a***@example.com: for logs and the admin, never the address itself."""
    if not value:
        return value
    masked = _EMAIL.sub(lambda m: m.group(1) + "***" + m.group(3), value)
    return masked if masked != value else "***"


def mask_phone(value: str | None) -> str | None:
    """***78: the last two digits only."""
    if not value:
        return value
    return "***" + value[-2:] if len(value) > 2 else "***"


def _contacts(customers: list[Customer]) -> list[Contact]:
    """Each customer's contact, from the representation the tenant's phase reads (the
    plaintext, while it is written, in one query for the list)."""
    phase = staged_phase(MIGRATION)
    legacy: dict[str, Contact] = {}
    # Reading the new representation, the plaintext is only wanted where a ciphertext is missing.
    wanted = [c.pk for c in customers if not reads_new(phase) or c.email_ciphertext is None or c.phone_ciphertext is None]
    if writes_old(phase) and wanted:
        rows = CustomerLegacyContact.objects.filter(pk__in=wanted).values_list("pk", "email", "phone")
        legacy = {pk: Contact(email, phone) for pk, email, phone in rows}
    contacts = []
    for customer in customers:
        old = legacy.get(customer.pk, Contact("", ""))
        if reads_new(phase):  # the plaintext stands in for a field the new path has not written
            email = old.email if customer.email_ciphertext is None else contact_decrypt(customer.email_ciphertext)
            phone = old.phone if customer.phone_ciphertext is None else contact_decrypt(customer.phone_ciphertext)
            old = Contact(email, phone)
        contacts.append(old)
    return contacts


def customer_contact(*, customer: Customer) -> Contact:
    return _contacts([customer])[0]


def customers_contact_attach(*, customers: list[Customer]) -> list[Customer]:
    """Set `email` and `phone` attributes (plain values, not model fields) on each
    customer, for rendering."""
    for customer, contact in zip(customers, _contacts(customers), strict=True):
        setattr(customer, "email", contact.email)  # noqa: B010 - not a model field any more
        setattr(customer, "phone", contact.phone)  # noqa: B010
    return customers


def customer_contact_attach(*, customer: Customer) -> Customer:
    return customers_contact_attach(customers=[customer])[0]


def customer_contact_masked(*, customer: Customer) -> Contact:
    """The contact as logs and the admin show it."""
    contact = customer_contact(customer=customer)
    return Contact(mask_email(contact.email) or "", mask_phone(contact.phone) or "")


def customers_find_by_email(*, email: str) -> QuerySet[Customer]:
    """Customers with this email (case-insensitive): by the keyed hash once reads have
    switched, by both representations while both are written."""
    digest = email_lookup_hash(email)
    if digest is None:
        return Customer.objects.none()
    phase = staged_phase(MIGRATION)
    ids: set[str] = set()
    if writes_new(phase):
        ids |= set(Customer.objects.filter(email_hash=digest).values_list("pk", flat=True))
    if not reads_new(phase):
        ids |= set(CustomerLegacyContact.objects.filter(email__iexact=email_normalise(email)).values_list("pk", flat=True))
    return Customer.objects.filter(pk__in=ids).select_related("account").order_by("created", "id")


def contact_new_fields(*, email: str | None = None, phone: str | None = None) -> dict[str, str | None]:
    """The new-representation column values for the given fields (None: not given)."""
    fields: dict[str, str | None] = {}
    if email is not None:
        fields["email_ciphertext"] = contact_encrypt(email)
        fields["email_hash"] = email_lookup_hash(email)
    if phone is not None:
        fields["phone_ciphertext"] = contact_encrypt(phone)
    return fields


def contact_write(*, customer: Customer, email: str | None = None, phone: str | None = None) -> None:
    """Write the given fields (None: leave it) to every representation the phase writes.
    The caller holds the customer's row lock (or just inserted it)."""
    if email is None and phone is None:
        return
    phase = staged_phase(MIGRATION)
    if writes_old(phase):
        old = {name: value for name, value in (("email", email), ("phone", phone)) if value is not None}
        CustomerLegacyContact.objects.filter(pk=customer.pk).update(**old)
    if writes_new(phase):
        new = contact_new_fields(email=email, phone=phone)
        for name, value in new.items():
            setattr(customer, name, value)
        Customer.objects.filter(pk=customer.pk).update(**new)
    logger.info(
        "customer contact written", extra={"customer": customer.pk, "email": mask_email(email), "phone": mask_phone(phone), "phase": str(phase)}
    )


def contact_changes(*, current: Contact, email: str | Unset | None, phone: str | Unset | None) -> tuple[str | None, str | None]:
    """What an update changes: for each field the new value, or None to leave it. UNSET
    leaves a field; None or "" clears it; a value equal to the current one is no change."""
    new_email = None if isinstance(email, Unset) else (email or "").strip()
    new_phone = None if isinstance(phone, Unset) else (phone or "").strip()
    return (None if new_email == current.email else new_email), (None if new_phone == current.phone else new_phone)


def _fill(columns: list[str], rows: list[tuple[str | None, ...]]) -> None:
    """One `UPDATE .. WHERE id = %s AND <first column> IS NULL` per row, pipelined by
    executemany (bulk_update's CASE arms took 90% of the backfill's time)."""
    if not rows:
        return
    qn = connection.ops.quote_name
    assignments = ", ".join(f"{qn(column)} = %s" for column in columns)
    with connection.cursor() as cursor:
        sql = f"UPDATE {qn(Customer._meta.db_table)} SET {assignments} WHERE id = %s AND {qn(columns[0])} IS NULL"  # noqa: S608 - identifiers ours
        cursor.executemany(sql, rows)


class CustomerContactsMigration(StagedMigration):
    name = MIGRATION
    description = "customer email/phone: plaintext columns -> Fernet-encrypted columns and an HMAC lookup hash"

    def expand(self) -> None:
        with connection.cursor() as cursor:
            columns = {column.name for column in connection.introspection.get_table_description(cursor, Customer._meta.db_table)}
        if not set(_NEW_COLUMNS) <= columns:
            raise StagedMigrationRefused("the encrypted columns are missing: run `manage.py migrate_schemas` (wallets 0009) first")
        if not {"email", "phone"} <= columns:
            raise StagedMigrationRefused("the plaintext columns are gone: nothing to migrate from")

    def backfill_total(self) -> int:
        return Customer.objects.count()

    def backfill_batch(self, *, after: str, limit: int, dry_run: bool) -> BatchResult:
        """Locks: the batch's customer rows in id order (customer_rows_lock), not with
        `dry_run`. Fills each ciphertext column that is NULL from the plaintext; a value
        the new path wrote (even a cleared one) is never overwritten."""
        if dry_run:
            ids = list(Customer.objects.filter(pk__gt=after).order_by("pk").values_list("pk", flat=True)[:limit])
        else:
            ids = customer_rows_lock(after=after, limit=limit)
        if not ids:
            return BatchResult(cursor=None, rows_seen=0, rows_written=0)
        rows = CustomerLegacyContact.objects.filter(pk__in=ids).values_list("pk", "email", "phone")
        legacy = {pk: (email, phone) for pk, email, phone in rows}
        email_rows: list[tuple[str | None, ...]] = []
        phone_rows: list[tuple[str | None, ...]] = []
        for customer in Customer.objects.filter(pk__in=ids).only("id", "email_ciphertext", "phone_ciphertext"):
            email, phone = legacy[customer.pk]
            if customer.email_ciphertext is None:
                email_rows.append((contact_encrypt(email), email_lookup_hash(email), customer.pk))
            if customer.phone_ciphertext is None:
                phone_rows.append((contact_encrypt(phone), customer.pk))
        if not dry_run:
            _fill(["email_ciphertext", "email_hash"], email_rows)
            _fill(["phone_ciphertext"], phone_rows)
        written = len({row[-1] for row in email_rows + phone_rows})
        return BatchResult(cursor=ids[-1] if len(ids) == limit else None, rows_seen=len(ids), rows_written=written)

    def verify(self) -> VerifyReport:
        """Every customer, in one REPEATABLE READ snapshot: the decrypted new values equal the
        plaintext ones and the hash matches. Differences name the customer, never the value."""
        report = VerifyReport()
        old_sum, new_sum = hashlib.sha256(), hashlib.sha256()
        with verify_snapshot():
            old_rows = CustomerLegacyContact.objects.order_by("pk").values_list("pk", "email", "phone").iterator(chunk_size=2000)
            new_rows = (
                Customer.objects.order_by("pk").values_list("pk", "email_ciphertext", "phone_ciphertext", "email_hash").iterator(chunk_size=2000)
            )
            customers = migrated = 0
            for (pk, email, phone), (new_pk, email_token, phone_token, digest) in zip(old_rows, new_rows, strict=True):
                assert pk == new_pk
                customers += 1
                old_sum.update(f"{pk}\x1f{email}\x1f{phone}\n".encode())
                new_email = None if email_token is None else contact_decrypt(email_token)
                new_phone = None if phone_token is None else contact_decrypt(phone_token)
                new_sum.update(f"{pk}\x1f{new_email}\x1f{new_phone}\n".encode())
                if new_email is None or new_phone is None:
                    report.differences.append(f"{pk}: not migrated ({'email' if new_email is None else 'phone'})")
                    continue
                migrated += 1
                if new_email != email:
                    report.differences.append(f"{pk}: email differs")
                if new_phone != phone:
                    report.differences.append(f"{pk}: phone differs")
                if digest != email_lookup_hash(email):
                    report.differences.append(f"{pk}: email hash differs")
        report.counts = {"customers": customers, "migrated": migrated}
        report.checksums = {"old": old_sum.hexdigest(), "new": new_sum.hexdigest()}
        return report

    def contract(self) -> None:
        """Drop the plaintext columns (a short lock_timeout, retried: it never queues payments)."""
        for _ in range(30):
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                    cursor.execute("ALTER TABLE wallets_customer DROP COLUMN IF EXISTS email, DROP COLUMN IF EXISTS phone")
                return
            except Exception as exc:  # lock_timeout: try again shortly
                if getattr(getattr(exc, "__cause__", None), "sqlstate", None) != "55P03":
                    raise
        raise StagedMigrationRefused("could not take the table lock to drop the plaintext columns; contract again later")

    def discard(self) -> None:
        written = Q(email_ciphertext__isnull=False) | Q(phone_ciphertext__isnull=False) | Q(email_hash__isnull=False)
        discard_in_batches(Customer.objects.filter(written), lambda rows: rows.update(**dict.fromkeys(_NEW_COLUMNS)), batch=1000)


def customer_contacts_new_tenant(**_: Any) -> None:
    """A new tenant has no plaintext contacts to move: it encrypts from its first customer on."""
    staged_start_contracted(migration=CustomerContactsMigration())
