"""Compiled statements (fastpath.compiled): the payment path's hot statements compiled once
per shape must send what the ORM would send, on the caller's own connection, in the
caller's tenant schema, and keep Django's guards."""

from __future__ import annotations

import re
import threading
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, IntegrityError, ProgrammingError, connection, transaction
from django.db.models import BigIntegerField, Case, F, Q, Value, When
from django.db.models.signals import post_save
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from fastpath.compiled import VALUES_ROWS_MAX, CompiledInsert, CompiledQuery, CompiledShapes, InsertBatch, Param
from payments.models import OutboxEvent
from tenants.models import Tenant
from tests.conftest import in_tenant, run_in_thread_tenant, statements_sent
from tests.factories import CustomerFactory, MerchantFactory, fund
from wallets import locks
from wallets.locks import LOCK_ORDER, OwnerRow, balance_rows_lock_by_owner
from wallets.models import Account, AccountKind, Balance, LedgerEntry, LedgerTransaction, LedgerTransactionKind, SystemRole
from wallets.selectors import account_of
from webhooks.models import WebhookDelivery, WebhookDeliveryAttempt, WebhookEndpoint


def _normalised(sql: str, params: tuple[Any, ...] | list[Any]) -> tuple[str, list[Any]]:
    # A Param is an expression, which Django wraps in parentheses; psycopg's Int2 is an int.
    return re.sub(r"\(%s\)", "%s", sql), [int(p) if isinstance(p, int) else p for p in params]


def _orm_sql(queryset: Any) -> tuple[str, list[Any]]:
    sql, params = queryset.query.get_compiler(using="default").as_sql()
    return _normalised(sql, params)


@pytest.mark.django_db(transaction=False)
def test_the_payment_lock_sends_what_the_orm_compiles(tenant: Tenant) -> None:
    rows = [
        OwnerRow(AccountKind.CUSTOMER, "cus_1", "JPY"),
        OwnerRow(AccountKind.CUSTOMER, "cus_1", "POINT"),
        OwnerRow(AccountKind.MERCHANT, "mer_1", "JPY", 7),
        OwnerRow(AccountKind.SYSTEM, SystemRole.BONUS_POOL, "POINT", 7),
    ]
    plan = (
        Balance.objects.filter(
            Q(account__customer_id="cus_1", shard=0, asset_id__in=["JPY", "POINT"])
            | Q(account__merchant_id="mer_1", shard=7, asset_id__in=["JPY"])
            | Q(account__system_role=SystemRole.BONUS_POOL, shard=7, asset_id__in=["POINT"])
        )
        .select_related("account", "asset")
        .defer(*locks.UNREAD_JOINED_COLUMNS)
        .order_by(*LOCK_ORDER)
    )
    orm = plan.select_for_update(of=("self",))
    shape = (True, (AccountKind.CUSTOMER, ("JPY", "POINT")), (AccountKind.MERCHANT, ("JPY",)), (AccountKind.SYSTEM, ("POINT",)))
    values = {"owner0": "cus_1", "shard0": 0, "owner1": "mer_1", "shard1": 7, "owner2": SystemRole.BONUS_POOL, "shard2": 7}
    with transaction.atomic():
        compiled = _normalised(*locks._BY_OWNER.get(shape).sql_with_params(**values))
        assert compiled == _orm_sql(orm)
    # The payment's plan: the same select without the lock.
    assert _normalised(*locks._BY_OWNER.get((False, *shape[1:])).sql_with_params(**values)) == _orm_sql(plan)
    assert "FOR UPDATE" not in _orm_sql(plan)[0]
    with transaction.atomic():
        locked = balance_rows_lock_by_owner(rows=rows)  # the parties do not exist; the bonus pool does
        assert [(row.account.system_role, row.asset_id, row.shard) for row in locked.rows.values()] == [(SystemRole.BONUS_POOL, "POINT", 7)]


@pytest.mark.django_db(transaction=False)
def test_the_account_lock_and_the_balance_update_send_what_the_orm_compiles(tenant: Tenant) -> None:
    orm_lock = (
        Balance.objects.filter(Q(account_id="acc_1", shard=3, asset_id__in=["JPY"]) | Q(account_id="acc_2", asset_id__in=["JPY", "POINT"]))
        .select_related("account", "asset")
        .defer(*locks.UNREAD_JOINED_COLUMNS)
        .order_by(*LOCK_ORDER)
        .select_for_update(of=("self",))
    )
    shape = ((False, ("JPY",)), (True, ("JPY", "POINT")))
    with transaction.atomic():
        compiled = _normalised(*locks._BY_ACCOUNT.get(shape).sql_with_params(account0="acc_1", shard0=3, account1="acc_2"))
        assert compiled == _orm_sql(orm_lock)

    for kinds in ((True, False), (False, True), (True, True)):
        for rows in (1, 3):
            statement = locks._BALANCES_ADD.get((rows, *kinds))
            values = {f"row{i}": 11 + i for i in range(rows)}
            values |= {f"balance{i}": 5 - i for i in range(rows)} if kinds[0] else {}
            values |= {f"held{i}": -2 - i for i in range(rows)} if kinds[1] else {}
            updates = {}
            for column, on in zip(("balance", "held"), kinds, strict=True):
                if on:
                    deltas = [values[f"{column}{i}"] for i in range(rows)]
                    updates[column] = F(column) + (
                        Value(deltas[0]) if rows == 1 else Case(
                            *(When(pk=11 + i, then=Value(d)) for i, d in enumerate(deltas)), default=Value(0), output_field=BigIntegerField()
                        )
                    )
            orm = Balance.objects.filter(pk__in=[11 + i for i in range(rows)]).query.chain(_update_query())
            orm.add_update_values(updates)
            assert _normalised(*statement.sql_with_params(**values)) == _orm_sql_of_query(orm), (rows, kinds)

    change = F("balance") + Case(
        When(pk=11, then=Value(5)), When(pk=12, then=Value(-5)), When(pk=13, then=Value(0)), default=Value(0), output_field=BigIntegerField()
    )
    orm_update = Balance.objects.filter(pk__in=[11, 12, 13]).query.chain(_update_query())
    orm_update.add_update_values({"balance": change})
    compiled_update = locks._BALANCES_ADD.get((3, True, False)).sql_with_params(
        row0=11, row1=12, row2=13, balance0=5, balance1=-5, balance2=0
    )
    assert _normalised(*compiled_update) == _orm_sql_of_query(orm_update)


def _update_query() -> Any:
    from django.db.models.sql import UpdateQuery

    return UpdateQuery


def _orm_sql_of_query(query: Any) -> tuple[str, list[Any]]:
    sql, params = query.get_compiler(using="default").as_sql()
    return _normalised(sql, params)


def test_a_statement_compiled_on_one_thread_runs_on_the_callers_connection(live_tenant: Tenant) -> None:
    """Django's connections are per thread; the compiler prepared by the first caller holds
    that thread's connection. A later caller on another thread must run on its own: here
    it must see the row its own open transaction just changed (on the compiling thread's
    connection it would not, and would run outside the caller's transaction)."""
    customer = CustomerFactory()
    fund(customer, 100)
    account = account_of(party=customer)
    statement = CompiledQuery(Balance.objects.filter(account_id=Param("account"), asset_id="JPY").select_for_update())
    with transaction.atomic():
        assert [row.balance for row in statement.select(account=account.id)] == [100]  # compiled here, on this thread

    seen: list[int] = []

    def other_thread() -> None:
        with transaction.atomic():
            Balance.objects.filter(account_id=account.id, asset_id="JPY").update(held=7)
            seen.extend(row.held for row in statement.select(account=account.id))
            transaction.set_rollback(True)

    worker = threading.Thread(target=run_in_thread_tenant, args=(live_tenant, other_thread))
    worker.start()
    worker.join(timeout=30)
    assert seen == [7]


@pytest.mark.django_db(transaction=False)
def test_a_compiled_statement_reads_the_current_tenant_schema(tenant: Tenant, tenant_b: Tenant) -> None:
    # Account ids are random per tenant (balance row ids are not: each schema's sequence
    # starts at 1, so the same pk in both schemas would prove nothing).
    statement = CompiledQuery(Balance.objects.filter(account__system_role=Param("role"), asset_id="POINT", shard=0))
    pool = Balance.objects.filter(account__system_role=SystemRole.BONUS_POOL, asset_id="POINT", shard=0)
    in_a = {row.account_id for row in statement.select(role=SystemRole.BONUS_POOL)}
    with in_tenant(tenant_b):
        in_b = {row.account_id for row in statement.select(role=SystemRole.BONUS_POOL)}
        assert in_b == set(pool.values_list("account_id", flat=True))
    assert connection.schema_name == tenant.schema_name
    assert in_a == set(pool.values_list("account_id", flat=True))
    assert len(in_a) == len(in_b) == 1 and in_a != in_b


def test_compiled_statements_keep_the_orms_transaction_guards(live_tenant: Tenant) -> None:
    locking = CompiledQuery(Balance.objects.filter(pk=Param("pk")).select_for_update())
    with transaction.atomic():
        locking.select(pk=0)  # compiled (inside a transaction, as Django requires)
    with pytest.raises(TransactionManagementError):
        locking.select(pk=0)  # the cached run outside a transaction is refused as well
    update = CompiledQuery(Balance.objects.filter(pk=Param("pk")), update={"held": F("held") + Param("by", output_field=BigIntegerField())})
    with pytest.raises(RuntimeError):
        update.update(pk=0, by=1)


def test_shapes_are_bounded() -> None:
    built: list[int] = []

    def build(shape: int) -> CompiledQuery[Balance]:
        built.append(shape)
        return CompiledQuery(Balance.objects.filter(pk=Param("pk")))

    shapes: CompiledShapes[Balance] = CompiledShapes(build, max_shapes=3)
    for shape in (1, 2, 3, 1, 4, 1):
        shapes.get(shape)
    assert built == [1, 2, 3, 4, 1]  # 4 started over; 1 is built again after that


@pytest.mark.django_db(transaction=False)
def test_compiled_inserts_write_what_save_and_bulk_create_write(tenant: Tenant) -> None:
    """The same instances inserted through the compiled insert and through the ORM's own
    save / bulk_create read back identical, column for column (ids and times aside)."""
    when = timezone.now()
    compiled_event = OutboxEvent(topic="t.compiled", payload={"amount": 5, "nested": {"a": [1, "x"]}}, created=when)
    orm_event = OutboxEvent(topic="t.compiled", payload={"amount": 5, "nested": {"a": [1, "x"]}}, created=when)
    CompiledInsert(OutboxEvent).insert(compiled_event)
    orm_event.save(force_insert=True)
    assert not compiled_event._state.adding
    columns = [f.attname for f in OutboxEvent._meta.concrete_fields if f.attname != "id"]
    rows = OutboxEvent.objects.filter(pk__in=[compiled_event.pk, orm_event.pk]).values(*columns)
    assert len(rows) == 2 and rows[0] == rows[1]

    txn = LedgerTransaction(kind=LedgerTransactionKind.ADJUSTMENT, reference="ref-compiled", created=when)
    CompiledInsert(LedgerTransaction).insert(txn)
    system = list(Account.objects.filter(kind=AccountKind.SYSTEM).order_by("id")[:2])
    legs = [(system[0], 3), (system[1], -3), (system[0], 4), (system[1], -4)]
    CompiledInsert(LedgerEntry).insert_many([LedgerEntry(transaction=txn, account=a, asset_id="POINT", amount=n, created=when) for a, n in legs])
    twin = LedgerTransaction(kind=LedgerTransactionKind.ADJUSTMENT, reference="ref-orm", created=when)
    twin.save(force_insert=True)
    LedgerEntry.objects.bulk_create([LedgerEntry(transaction=twin, account=a, asset_id="POINT", amount=n, created=when) for a, n in legs])
    entry_columns = ["account_id", "asset_id", "amount", "created"]
    assert list(LedgerEntry.objects.filter(transaction=txn).order_by("id").values(*entry_columns)) == list(
        LedgerEntry.objects.filter(transaction=twin).order_by("id").values(*entry_columns)
    )
    assert LedgerTransaction.objects.filter(pk=txn.pk).values("kind", "created").get() == {"kind": txn.kind, "created": when}


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("rows", [2, VALUES_ROWS_MAX, VALUES_ROWS_MAX + 2, 20])
def test_a_compiled_insert_of_a_few_rows_sends_values_and_of_many_arrays(tenant: Tenant, rows: int) -> None:
    """Up to VALUES_ROWS_MAX rows go as one VALUES row of scalars each, more as Django's
    one array per column (UNNEST); both write what bulk_create writes, in order."""
    when = timezone.now()
    system = list(Account.objects.filter(kind=AccountKind.SYSTEM).order_by("id")[:2])
    legs = [(system[i % 2], (i // 2 + 1) * (1 if i % 2 else -1)) for i in range(rows)]  # pairs that balance
    txn = LedgerTransaction(kind=LedgerTransactionKind.ADJUSTMENT, reference=f"ref-form-{rows}", created=when)
    twin = LedgerTransaction(kind=LedgerTransactionKind.ADJUSTMENT, reference=f"ref-form-orm-{rows}", created=when)
    txn.save(force_insert=True)
    twin.save(force_insert=True)
    entries = [LedgerEntry(transaction=txn, account=a, asset_id="POINT", amount=n, created=when) for a, n in legs]
    sent = statements_sent(lambda: CompiledInsert(LedgerEntry).insert_many(entries))
    LedgerEntry.objects.bulk_create([LedgerEntry(transaction=twin, account=a, asset_id="POINT", amount=n, created=when) for a, n in legs])
    [(sql, params)] = sent
    if rows <= VALUES_ROWS_MAX:
        assert "UNNEST" not in sql and sql.count("(%s, ") == rows and not any(isinstance(p, list) for p in params)
    else:
        assert "UNNEST" in sql and all(isinstance(p, list) and len(p) == rows for p in params)
    entry_columns = ["account_id", "asset_id", "amount", "created"]
    written = list(LedgerEntry.objects.filter(transaction=txn).order_by("id").values(*entry_columns))
    assert written == list(LedgerEntry.objects.filter(transaction=twin).order_by("id").values(*entry_columns))
    assert [row["amount"] for row in written] == [n for _, n in legs]


@pytest.mark.django_db(transaction=False)
def test_a_compiled_values_insert_stores_nulls_and_booleans_as_bulk_create_does(tenant: Tenant) -> None:
    """A drain page's attempts go as VALUES rows: a NULL in the first row (no HTTP answer)
    and booleans both ways must land as the columns' types, as bulk_create stores them."""
    merchant = MerchantFactory()
    endpoint = WebhookEndpoint.objects.create(merchant=merchant, url="https://hooks.example/")
    event = OutboxEvent.objects.create(topic="t.attempts", payload={})
    when = timezone.now()
    delivery = WebhookDelivery.objects.create(endpoint=endpoint, event=event, topic=event.topic, event_created=when, give_up_at=when)
    outcomes = [(False, None, "connection refused"), (True, 200, ""), (False, 503, "")]

    def attempts() -> list[WebhookDeliveryAttempt]:
        return [
            WebhookDeliveryAttempt(delivery=delivery, attempted_at=when, succeeded=ok, status_code=code, latency_ms=i, error=error)
            for i, (ok, code, error) in enumerate(outcomes)
        ]

    [(sql, params)] = statements_sent(lambda: CompiledInsert(WebhookDeliveryAttempt).insert_many(attempts()))
    assert "UNNEST" not in sql and any(p is None for p in params) and any(p is True for p in params)  # not 1 == True
    stored = WebhookDeliveryAttempt.objects.filter(delivery=delivery).order_by("id")
    columns = ["attempted_at", "succeeded", "status_code", "latency_ms", "address", "response_excerpt", "error"]
    compiled = list(stored.values(*columns))
    stored.delete()
    WebhookDeliveryAttempt.objects.bulk_create(attempts())
    assert compiled == list(stored.values(*columns))
    assert [(row["succeeded"], row["status_code"]) for row in compiled] == [(False, None), (True, 200), (False, 503)]


@pytest.mark.django_db(transaction=False)
def test_a_compiled_insert_sends_save_s_signals_when_someone_listens(tenant: Tenant) -> None:
    heard: list[str] = []

    def receiver(sender: Any, instance: OutboxEvent, created: bool, **kwargs: Any) -> None:
        heard.append(instance.topic)

    post_save.connect(receiver, sender=OutboxEvent, weak=False)
    try:
        CompiledInsert(OutboxEvent).insert(OutboxEvent(topic="t.heard", payload={}))
    finally:
        post_save.disconnect(receiver, sender=OutboxEvent)
    CompiledInsert(OutboxEvent).insert(OutboxEvent(topic="t.unheard", payload={}))
    assert heard == ["t.heard"]
    assert set(OutboxEvent.objects.filter(topic__in=["t.heard", "t.unheard"]).values_list("topic", flat=True)) == {"t.heard", "t.unheard"}


def _round_trips(fn: Any) -> list[str]:
    """The SQL strings `fn` sends, one per round trip (django-tenants' SET search_path aside)."""
    return [sql for sql, _ in statements_sent(fn) if not sql.startswith("SET search_path")]


def _batch_rows(tag: str, when: Any) -> tuple[LedgerTransaction, list[LedgerEntry], OutboxEvent]:
    system = list(Account.objects.filter(kind=AccountKind.SYSTEM).order_by("id")[:2])
    txn = LedgerTransaction(kind=LedgerTransactionKind.ADJUSTMENT, reference=f"ref-{tag}", created=when)
    entries = [LedgerEntry(transaction=txn, account=a, asset_id="POINT", amount=n, created=when) for a, n in [(system[0], 7), (system[1], -7)]]
    return txn, entries, OutboxEvent(topic=f"t.{tag}", payload={"tag": tag, "amount": 7}, created=when)


def _ignore(**kwargs: Any) -> None:
    pass


def _batch_of(txn: LedgerTransaction, entries: list[LedgerEntry], event: OutboxEvent) -> InsertBatch:
    batch = InsertBatch()
    batch.add(CompiledInsert(LedgerTransaction), [txn])
    batch.add(CompiledInsert(LedgerEntry), entries)
    batch.add(CompiledInsert(OutboxEvent), [event])
    return batch


def _written(txn: LedgerTransaction, event: OutboxEvent) -> tuple[Any, ...]:
    return (
        LedgerTransaction.objects.filter(pk=txn.pk).values("kind", "created").first(),
        list(LedgerEntry.objects.filter(transaction=txn).order_by("id").values("account_id", "asset_id", "amount", "created")),
        OutboxEvent.objects.filter(pk=event.pk).values("topic", "payload", "created", "published_at", "attempts").first(),
    )


@pytest.mark.django_db(transaction=False)
def test_an_insert_batch_writes_what_single_inserts_write_in_one_round_trip(tenant: Tenant) -> None:
    """The payment path's pre-lock inserts go as one statement string; the rows read back
    exactly as the same rows inserted one statement at a time, and nothing is sent before
    `execute`."""
    when = timezone.now()
    batched = _batch_rows("batched", when)
    batch = _batch_of(*batched)
    assert batched[2]._state.adding  # not saved until sent
    sent = _round_trips(batch.execute)
    assert len(sent) == 1 and [sql.split()[:3] for sql in sent[0].split(";\n")] == [
        ["INSERT", "INTO", '"wallets_ledgertransaction"'], ["INSERT", "INTO", '"wallets_ledgerentry"'], ["INSERT", "INTO", '"payments_outboxevent"'],
    ]
    assert not any(obj._state.adding for obj in [batched[0], *batched[1], batched[2]])
    assert _round_trips(batch.execute) == []  # executed once: the batch is empty now

    single = _batch_rows("single", when)
    CompiledInsert(LedgerTransaction).insert(single[0])
    CompiledInsert(LedgerEntry).insert_many(single[1])
    CompiledInsert(OutboxEvent).insert(single[2])
    got, want = _written(batched[0], batched[2]), _written(single[0], single[2])
    assert got[0] == want[0] and got[1] == want[1] and len(got[1]) == 2
    untagged = [{**row, "topic": "-", "payload": {**row["payload"], "tag": "-"}} for row in (got[2], want[2])]
    assert untagged[0] == untagged[1]


@pytest.mark.django_db(transaction=False)
def test_an_insert_batch_that_fails_leaves_none_of_its_rows(tenant: Tenant) -> None:
    """A statement that fails mid-string (here the event, a duplicate id) raises as a
    single insert would; rolled back to the caller's savepoint, none of the batch's rows
    is left, the earlier statements' included, and the transaction carries on."""
    when = timezone.now()
    taken = OutboxEvent(topic="t.taken", payload={}, created=when)
    CompiledInsert(OutboxEvent).insert(taken)
    txn, entries, event = _batch_rows("failing", when)
    event.id = taken.id
    batch = _batch_of(txn, entries, event)
    with pytest.raises(IntegrityError), transaction.atomic():  # the caller's savepoint
        batch.execute()
    assert not LedgerTransaction.objects.filter(pk=txn.pk).exists()
    assert not LedgerEntry.objects.filter(transaction_id=txn.pk).exists()
    assert OutboxEvent.objects.filter(pk=taken.pk).values_list("topic", flat=True).get() == "t.taken"


@pytest.mark.django_db(transaction=False)
def test_an_insert_batch_in_a_savepoint_opens_it_in_the_same_round_trip(tenant: Tenant) -> None:
    """`execute_in_savepoint` sends SAVEPOINT and the inserts as one string; rolling back
    to the id it returns removes the rows, and a batch that fails rolls back to it itself."""
    when = timezone.now()
    txn, entries, event = _batch_rows("in-savepoint", when)
    sids: list[str] = []
    sent = _round_trips(lambda: sids.append(_batch_of(txn, entries, event).execute_in_savepoint()))
    assert len(sent) == 1 and sent[0].startswith(f'SAVEPOINT "{sids[0]}";\n') and len(sent[0].split(";\n")) == 4
    assert _written(txn, event)[2] is not None
    transaction.savepoint_rollback(sids[0])
    assert _written(txn, event) == (None, [], None)


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("through_save", [False, True], ids=["compiled", "through-save"])
def test_an_insert_batch_that_fails_in_its_savepoint_leaves_the_transaction_usable(tenant: Tenant, through_save: bool) -> None:
    """A failed `execute_in_savepoint` rolls back to its savepoint, like an inner atomic
    block, also when the failing insert went through save() (which marks the transaction
    for rollback): none of its rows stays and the transaction carries on."""
    when = timezone.now()
    taken = OutboxEvent(topic="t.taken", payload={}, created=when)
    CompiledInsert(OutboxEvent).insert(taken)
    txn, entries, event = _batch_rows("failing-in-savepoint", when)
    event.id = taken.id
    if through_save:
        post_save.connect(_ignore, sender=OutboxEvent, weak=False)
    try:
        with pytest.raises(IntegrityError):
            _batch_of(txn, entries, event).execute_in_savepoint()
    finally:
        post_save.disconnect(_ignore, sender=OutboxEvent)
    assert not transaction.get_rollback()  # the transaction carries on
    assert not LedgerTransaction.objects.filter(pk=txn.pk).exists()
    assert not LedgerEntry.objects.filter(transaction_id=txn.pk).exists()
    assert OutboxEvent.objects.filter(pk=taken.pk).values_list("topic", flat=True).get() == "t.taken"


@pytest.mark.django_db(transaction=False)
def test_an_insert_batch_sends_save_s_signals_in_order_when_someone_listens(tenant: Tenant) -> None:
    """With a receiver on one model, that model's rows go through `save()` in their place
    in the order (what came before them is sent first), and the rest still go together."""
    heard: list[tuple[str, bool]] = []

    def receiver(sender: Any, instance: LedgerTransaction, created: bool, **kwargs: Any) -> None:
        # The entries added before it were sent already; the ones after were not.
        heard.append((instance.reference, LedgerEntry.objects.filter(transaction_id="txn_before").exists()))

    when = timezone.now()
    system = list(Account.objects.filter(kind=AccountKind.SYSTEM).order_by("id")[:2])
    before = [
        LedgerEntry(transaction_id="txn_before", account=a, asset_id="POINT", amount=n, created=when) for a, n in [(system[0], 1), (system[1], -1)]
    ]
    txn, entries, event = _batch_rows("heard", when)
    post_save.connect(receiver, sender=LedgerTransaction, weak=False)
    try:
        batch = InsertBatch()
        batch.add(CompiledInsert(LedgerEntry), before)
        batch.add(CompiledInsert(LedgerTransaction), [txn])
        batch.add(CompiledInsert(LedgerEntry), entries)
        batch.add(CompiledInsert(OutboxEvent), [event])
        sent = _round_trips(batch.execute)
    finally:
        post_save.disconnect(receiver, sender=LedgerTransaction)
    assert heard == [("ref-heard", True)]
    assert [len(sql.split(";\n")) for sql in sent if sql.startswith("INSERT")] == [1, 1, 2]
    assert _written(txn, event)[0] is not None and len(_written(txn, event)[1]) == 2 and _written(txn, event)[2] is not None


@pytest.mark.django_db(transaction=False)
def test_an_insert_batch_sends_one_statement_per_round_trip_with_server_side_binding(tenant: Tenant, monkeypatch: Any) -> None:
    """On a connection whose cursors bind server-side (a prepared statement per execute,
    which takes one command), each statement goes on its own, and still lands."""
    from django.db.backends.postgresql.base import ServerBindingCursor

    monkeypatch.setattr(connection.connection, "cursor_factory", ServerBindingCursor)
    with pytest.raises(DatabaseError, match="multiple commands"), transaction.atomic():  # what a joined string would meet
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s; SELECT %s", [1, 2])
    txn, entries, event = _batch_rows("server-side", timezone.now())
    sent = _round_trips(_batch_of(txn, entries, event).execute)
    assert [len(sql.split(";\n")) for sql in sent] == [1, 1, 1]
    assert _written(txn, event)[2] is not None and len(_written(txn, event)[1]) == 2
    txn, entries, event = _batch_rows("server-side-savepoint", timezone.now())
    sids: list[str] = []
    sent = _round_trips(lambda: sids.append(_batch_of(txn, entries, event).execute_in_savepoint()))
    assert [len(sql.split(";\n")) for sql in sent] == [1, 1, 1, 1] and sent[0].startswith("SAVEPOINT")
    transaction.savepoint_rollback(sids[0])
    assert _written(txn, event) == (None, [], None)


def test_an_event_its_caller_inserts_needs_a_transaction(live_tenant: Tenant) -> None:
    """Outside a transaction the relay kick would run at once, before the caller inserts the
    event: refused."""
    from payments.services.outbox import outbox_event_new
    from wallets.locks import rows_insert

    with pytest.raises(TransactionManagementError):
        outbox_event_new(topic="t.no-transaction", payload={})
    with transaction.atomic():
        rows_insert([outbox_event_new(topic="t.in-transaction", payload={})])
    assert OutboxEvent.objects.filter(topic="t.in-transaction").exists()
    assert not OutboxEvent.objects.filter(topic="t.no-transaction").exists()


def test_the_mandate_check_sees_only_active_mandates_of_its_tenant(tenant: Tenant, tenant_b: Tenant) -> None:
    from payments import selectors
    from payments.models import Mandate
    from payments.services.mandates import mandate_grant, mandate_revoke
    from tests.factories import MerchantFactory

    customer, merchant, other = CustomerFactory(), MerchantFactory(), MerchantFactory()
    assert not selectors.mandate_active_exists(customer_id=customer.pk, merchant_id=merchant.pk)
    mandate = mandate_grant(customer=customer, merchant=merchant)
    assert selectors.mandate_active_exists(customer_id=customer.pk, merchant_id=merchant.pk)
    assert not selectors.mandate_active_exists(customer_id=customer.pk, merchant_id=other.pk)
    assert not selectors.mandate_active_exists(customer_id=CustomerFactory().pk, merchant_id=merchant.pk)
    # The same ids in another tenant's schema, with no mandate there.
    with in_tenant(tenant_b):
        assert not Mandate.objects.exists()
        assert not selectors.mandate_active_exists(customer_id=customer.pk, merchant_id=merchant.pk)
    assert selectors.mandate_active_exists(customer_id=customer.pk, merchant_id=merchant.pk)
    mandate_revoke(mandate=mandate)
    assert not selectors.mandate_active_exists(customer_id=customer.pk, merchant_id=merchant.pk)


@pytest.mark.django_db(transaction=False)
def test_a_batch_rolls_back_to_its_own_savepoint_when_an_earlier_batch_is_kept(tenant: Tenant) -> None:
    """Two batches in one transaction, the first kept: rolling back to the id the second
    returned removes its rows only, and so does a third that fails."""
    when = timezone.now()
    first = _batch_rows("kept", when)
    _batch_of(*first).execute_in_savepoint()
    second = _batch_rows("rolled-back", when)
    sid = _batch_of(*second).execute_in_savepoint()
    transaction.savepoint_rollback(sid)
    assert _written(second[0], second[2]) == (None, [], None)
    kept = _written(first[0], first[2])
    assert kept[0] is not None and len(kept[1]) == 2 and kept[2] is not None
    # And a failing batch after them goes back to its own savepoint, leaving the first.
    taken = first[2]
    txn, entries, event = _batch_rows("failing-after", when)
    event.id = taken.id
    with pytest.raises(IntegrityError):
        _batch_of(txn, entries, event).execute_in_savepoint()
    assert not LedgerTransaction.objects.filter(pk=txn.pk).exists()
    kept_again = _written(first[0], first[2])
    assert kept_again == kept


def test_a_batch_sends_the_same_text_in_every_transaction_and_a_new_savepoint_within_one(live_tenant: Tenant) -> None:
    """Savepoint names are counted per transaction: the payment's batch is the same string
    in every transaction (psycopg converts it once per process, not once per payment),
    while two batches of one transaction, even around a savepoint rollback, never share a
    name (see the two tests below for why they must not)."""
    when = timezone.now()

    def two_batches_rolled_back(tag: str) -> tuple[list[str], list[str]]:
        with transaction.atomic():
            first, second = (_batch_of(*_batch_rows(f"{tag}-{n}", when)) for n in range(2))
            sids: list[str] = []
            sent = _round_trips(lambda: sids.append(first.execute_in_savepoint()))
            transaction.savepoint_rollback(sids[0])
            sent += _round_trips(lambda: sids.append(second.execute_in_savepoint()))
            transaction.set_rollback(True)  # nothing stays in tenant A
        return sent, sids

    first_batches = []
    for tag in ("text-a", "text-b"):
        sent, sids = two_batches_rolled_back(tag)
        assert len(sent) == 2 and len(set(sids)) == 2
        assert sent[0].split(";\n", 1)[1] == sent[1].split(";\n", 1)[1]  # the inserts alike, the savepoints not
        first_batches.append(sent[0])
    assert first_batches[0] == first_batches[1]


def test_savepoint_names_start_again_only_when_a_transaction_has_ended(live_tenant: Tenant) -> None:
    """The count goes on through nested atomic blocks, their rollbacks and a commit psycopg
    refuses before sending it (the transaction is still open: a repeated name there would
    send a failing batch back to an earlier batch's savepoint); it starts again after a
    commit and after a rollback."""
    name = connection.savepoint_name_in_transaction
    transaction.set_autocommit(False)
    try:
        assert name("t") == "t_1"
        with transaction.atomic():
            assert name("t") == "t_2"
            with transaction.atomic():
                assert name("t") == "t_3"
                transaction.set_rollback(True)
        with connection.connection.transaction(), pytest.raises(ProgrammingError):
            transaction.commit()  # refused by psycopg inside its own transaction block
        assert name("t") == "t_4"
        transaction.commit()
        assert name("t") == "t_1"
        transaction.rollback()
        assert name("t") == "t_1"
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)


@pytest.mark.django_db(transaction=False)
def test_a_batch_that_fails_before_its_savepoint_opens_dooms_the_transaction_not_an_earlier_batch(tenant: Tenant) -> None:
    """A batch that fails in Python before anything is sent (a payload JSON cannot encode)
    has no savepoint yet: it must not go back to an earlier batch's (as one savepoint name
    shared by every batch would), which would undo the earlier
    batch's rows and let the transaction commit without them. The whole transaction is
    marked for rollback instead."""
    when = timezone.now()
    _batch_of(*_batch_rows("kept-before-a-python-failure", when)).execute_in_savepoint()
    txn, entries, event = _batch_rows("unencodable", when)
    event.payload = {"not json": object()}
    with pytest.raises(TypeError):
        _batch_of(txn, entries, event).execute_in_savepoint()
    assert transaction.get_rollback()  # the whole transaction goes: nothing can commit without the earlier rows


@pytest.mark.django_db(transaction=False)
def test_a_batch_in_an_aborted_transaction_does_not_revive_it_through_an_earlier_savepoint(tenant: Tenant) -> None:
    """A transaction the server aborted behind Django's back: the batch's SAVEPOINT fails
    (25P02). Going back to an earlier batch's savepoint (as a shared savepoint name did)
    would bring the transaction back to life without what came after it."""
    from psycopg.pq import TransactionStatus

    when = timezone.now()
    _batch_of(*_batch_rows("kept-before-an-abort", when)).execute_in_savepoint()
    second = _batch_of(*_batch_rows("in-the-aborted", when))
    with pytest.raises(psycopg.errors.DivisionByZero):
        connection.connection.execute("SELECT 1 / 0")  # psycopg's own cursor: Django does not know
    with pytest.raises(DatabaseError) as failure:
        second.execute_in_savepoint()
    assert "25P02" in repr(getattr(failure.value.__cause__, "sqlstate", None))
    assert connection.connection.info.transaction_status == TransactionStatus.INERROR
    assert transaction.get_rollback()
