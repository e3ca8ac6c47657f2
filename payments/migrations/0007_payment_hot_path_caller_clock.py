"""tally_payment_create takes the creation time from the caller (Python's clock, like every
other timestamp the services write) instead of now(), the start of the enclosing
transaction: a payment made inside a longer transaction sorted before rows written
earlier in it. Same body otherwise (see 0004)."""

from importlib import import_module

from django.db import migrations

FORWARD = r"""
DROP FUNCTION IF EXISTS tally_payment_create(text, text, text, text, text, text, text, bigint, bigint, bigint, text, text, integer);

CREATE OR REPLACE FUNCTION tally_payment_create(
    p_payment_id text, p_txn_id text, p_event_id text,
    p_customer_id text, p_terminal_id text, p_merchant_id text,
    p_asset text, p_amount bigint, p_points bigint, p_grams bigint,
    p_points_asset text, p_carbon_asset text, p_shards integer, p_created timestamptz,
    OUT code text, OUT merchant_id text, OUT store_id text,
    OUT points bigint, OUT grams bigint, OUT created timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    -- The caller's clock, like every other timestamp the services write (not the
    -- transaction start, which an enclosing idempotency transaction moves earlier).
    v_now timestamptz := p_created;
    -- One connection keeps to one shard: with no more connections than shards, payments
    -- to one merchant rarely wait for each other.
    v_shard smallint := pg_backend_pid() % p_shards;
    v_cust_acc text;
    v_cust_frozen boolean;
    v_merch_acc text;
    v_merch_frozen boolean;
    v_asset_known boolean;
    v_points_cap bigint;
    v_carbon_cap bigint;
    v_bonus_acc text;
    v_registry_acc text;
BEGIN
    created := v_now;
    points := 0;
    grams := 0;
    SELECT m.merchant_id, m.store_id, m.account_id, m.frozen,
           ca.id, ca.frozen,
           EXISTS (SELECT 1 FROM wallets_asset WHERE wallets_asset.code = p_asset),
           (SELECT cap FROM wallets_asset WHERE wallets_asset.code = p_points_asset),
           (SELECT cap FROM wallets_asset WHERE wallets_asset.code = p_carbon_asset),
           (SELECT id FROM wallets_account WHERE system_role = 'bonus_pool'),
           (SELECT id FROM wallets_account WHERE system_role = 'carbon_registry')
      INTO merchant_id, store_id, v_merch_acc, v_merch_frozen, v_cust_acc, v_cust_frozen,
           v_asset_known, v_points_cap, v_carbon_cap, v_bonus_acc, v_registry_acc
      FROM (SELECT s.merchant_id, s.id AS store_id, ma.id AS account_id, ma.frozen
              FROM wallets_terminal t
              JOIN wallets_store s ON s.id = t.store_id
              JOIN wallets_account ma ON ma.merchant_id = s.merchant_id
             WHERE p_terminal_id IS NOT NULL AND t.id = p_terminal_id
            UNION ALL
            SELECT ma.merchant_id, NULL, ma.id, ma.frozen
              FROM wallets_account ma
             WHERE p_terminal_id IS NULL AND ma.merchant_id = p_merchant_id) AS m
      LEFT JOIN wallets_account ca ON ca.customer_id = p_customer_id;
    IF v_merch_acc IS NULL THEN
        code := 'merchant_missing';
        RETURN;
    END IF;
    IF v_cust_acc IS NULL THEN
        code := 'customer_missing';
        RETURN;
    END IF;
    IF NOT v_asset_known THEN
        code := 'asset_unknown';
        RETURN;
    END IF;
    IF v_cust_frozen OR v_merch_frozen THEN
        code := 'wallet_frozen';
        RETURN;
    END IF;

    -- The conditional debit is the check: nothing has been written if it matches no row.
    UPDATE wallets_balance SET balance = balance - p_amount
     WHERE account_id = v_cust_acc AND asset_id = p_asset AND shard = 0 AND balance - held >= p_amount;
    IF NOT FOUND THEN
        code := 'insufficient_funds';
        RETURN;
    END IF;

    IF v_points_cap IS NULL AND v_carbon_cap IS NULL THEN
        points := p_points;
        grams := p_grams;
        -- Customer reward rows, then the merchant shard, then the system shards: the lock order.
        INSERT INTO wallets_balance AS b (account_id, asset_id, shard, balance, held, may_go_negative)
        SELECT v.account_id, v.asset_id, v.shard, v.amount, 0, v.may_go_negative
          FROM (VALUES (CASE WHEN p_carbon_asset < p_points_asset THEN 1 ELSE 2 END, v_cust_acc, p_carbon_asset, 0::smallint, grams, false),
                       (CASE WHEN p_carbon_asset < p_points_asset THEN 2 ELSE 1 END, v_cust_acc, p_points_asset, 0::smallint, points, false),
                       (3, v_merch_acc, p_asset, v_shard, p_amount, false),
                       (4, v_bonus_acc, p_points_asset, v_shard, -points, true),
                       (5, v_registry_acc, p_carbon_asset, v_shard, -grams, true))
               AS v(ord, account_id, asset_id, shard, amount, may_go_negative)
         WHERE v.amount <> 0
         ORDER BY v.ord
        ON CONFLICT (account_id, asset_id, shard) DO UPDATE SET balance = b.balance + EXCLUDED.balance;
    ELSE
        IF p_carbon_asset < p_points_asset THEN
            grams := tally_customer_reward_credit(v_cust_acc, p_carbon_asset, p_grams, v_carbon_cap);
            points := tally_customer_reward_credit(v_cust_acc, p_points_asset, p_points, v_points_cap);
        ELSE
            points := tally_customer_reward_credit(v_cust_acc, p_points_asset, p_points, v_points_cap);
            grams := tally_customer_reward_credit(v_cust_acc, p_carbon_asset, p_grams, v_carbon_cap);
        END IF;
        INSERT INTO wallets_balance AS b (account_id, asset_id, shard, balance, held, may_go_negative)
        SELECT v.account_id, v.asset_id, v_shard, v.amount, 0, v.may_go_negative
          FROM (VALUES (1, v_merch_acc, p_asset, p_amount, false),
                       (2, v_bonus_acc, p_points_asset, -points, true),
                       (3, v_registry_acc, p_carbon_asset, -grams, true)) AS v(ord, account_id, asset_id, amount, may_go_negative)
         WHERE v.amount <> 0
         ORDER BY v.ord
        ON CONFLICT (account_id, asset_id, shard) DO UPDATE SET balance = b.balance + EXCLUDED.balance;
    END IF;

    -- Foreign keys between these rows are checked at the end of the statement, when all exist.
    WITH txn AS (
        INSERT INTO wallets_ledgertransaction (id, kind, reference, created) VALUES (p_txn_id, 'payment', p_payment_id, v_now)
    ), entries AS (
        INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
        SELECT p_txn_id, e.account_id, e.asset_id, e.amount, v_now
          FROM (VALUES (v_cust_acc, p_asset, -p_amount), (v_merch_acc, p_asset, p_amount),
                       (v_cust_acc, p_points_asset, points), (v_bonus_acc, p_points_asset, -points),
                       (v_cust_acc, p_carbon_asset, grams), (v_registry_acc, p_carbon_asset, -grams)) AS e(account_id, asset_id, amount)
         WHERE e.amount <> 0
    ), payment AS (
        INSERT INTO payments_payment (id, status, customer_id, merchant_id, store_id, terminal_id, asset_id, amount, amount_refunded,
                                      points_earned, points_reversed, carbon_grams, carbon_grams_reversed, ledger_transaction_id, created)
        VALUES (p_payment_id, 'succeeded', p_customer_id, merchant_id, store_id, p_terminal_id, p_asset, p_amount, 0,
                points, 0, grams, 0, p_txn_id, v_now)
    ), impact AS (
        INSERT INTO wallets_carbonimpact AS c (account_id, shard, grams)
        SELECT i.account_id, i.shard, grams
          FROM (VALUES (1, v_cust_acc, 0::smallint), (2, v_merch_acc, v_shard)) AS i(ord, account_id, shard)
         WHERE grams > 0
         ORDER BY i.ord
        ON CONFLICT (account_id, shard) DO UPDATE SET grams = c.grams + EXCLUDED.grams
    )
    INSERT INTO payments_outboxevent (id, topic, payload, created, published_at, attempts, last_error)
    VALUES (p_event_id, 'payment.succeeded',
            jsonb_build_object('id', p_payment_id, 'object', 'payment', 'status', 'succeeded', 'asset', p_asset,
                               'amount', p_amount, 'customer', p_customer_id, 'merchant', merchant_id, 'store', store_id,
                               'terminal', p_terminal_id, 'points_earned', points, 'carbon_grams', grams,
                               'created', floor(extract(epoch FROM v_now))::bigint),
            v_now, NULL, 0, '');
    code := 'ok';
END;
$$;
"""

# Backwards: drop this signature and restore 0004's function, which the code of that
# state calls (rolling back a release must leave a working payment path).
BACKWARD = """
DROP FUNCTION IF EXISTS tally_payment_create(text, text, text, text, text, text, text, bigint, bigint, bigint, text, text, integer, timestamptz);
""" + import_module("payments.migrations.0004_payment_hot_path_fewer_statements").FORWARD


class Migration(migrations.Migration):
    dependencies = [("payments", "0006_drop_pattern_indexes_on_hot_tables")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD, elidable=True)]
