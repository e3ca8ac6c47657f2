"""The payment hot path as one PL/pgSQL function: one SQL round trip per payment.

The functions live in each tenant schema (created here in the template schema and cloned
with it) and name no schema: tables resolve through the caller's search_path, which
django-tenants sets to the tenant. PL/pgSQL caches its plans per function and per
session, and PostgreSQL re-plans a cached statement when search_path differs from the
one it was planned under, so one connection serving several tenants stays correct.

Lock order (the same as wallets.services.ledger.lock_key): the customer's rows first
(the paid asset, then the reward assets CARBON and POINT in code order), then one
merchant shard, then one shard of each system account, then the carbon aggregates.
Business refusals are returned as a code before anything is written, so the caller's
transaction (the idempotency layer's) stays usable to store the refusal.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION tally_customer_reward_credit(p_account text, p_asset text, p_amount bigint, p_cap bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_current bigint;
    v_applied bigint;
BEGIN
    IF p_amount <= 0 THEN
        RETURN 0;
    END IF;
    IF p_cap IS NULL THEN
        INSERT INTO wallets_balance (account_id, asset_id, shard, balance, held, may_go_negative)
        VALUES (p_account, p_asset, 0, p_amount, 0, false)
        ON CONFLICT (account_id, asset_id, shard) DO UPDATE SET balance = wallets_balance.balance + EXCLUDED.balance;
        RETURN p_amount;
    END IF;
    -- Capped reward asset: earn only what still fits under the cap (never refuse a payment for it).
    INSERT INTO wallets_balance (account_id, asset_id, shard, balance, held, may_go_negative)
    VALUES (p_account, p_asset, 0, 0, 0, false) ON CONFLICT (account_id, asset_id, shard) DO NOTHING;
    SELECT balance INTO v_current FROM wallets_balance
     WHERE account_id = p_account AND asset_id = p_asset AND shard = 0 FOR UPDATE;
    v_applied := LEAST(p_amount, GREATEST(p_cap - v_current, 0));
    IF v_applied > 0 THEN
        UPDATE wallets_balance SET balance = balance + v_applied
         WHERE account_id = p_account AND asset_id = p_asset AND shard = 0;
    END IF;
    RETURN v_applied;
END;
$$;

CREATE OR REPLACE FUNCTION tally_payment_create(
    p_payment_id text, p_txn_id text, p_event_id text,
    p_customer_id text, p_terminal_id text, p_merchant_id text,
    p_asset text, p_amount bigint, p_points bigint, p_grams bigint,
    p_points_asset text, p_carbon_asset text, p_shards integer,
    OUT code text, OUT merchant_id text, OUT store_id text,
    OUT points bigint, OUT grams bigint, OUT created timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
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
    IF p_terminal_id IS NOT NULL THEN
        SELECT s.merchant_id, s.id, ma.id, ma.frozen INTO merchant_id, store_id, v_merch_acc, v_merch_frozen
          FROM wallets_terminal t
          JOIN wallets_store s ON s.id = t.store_id
          JOIN wallets_account ma ON ma.merchant_id = s.merchant_id
         WHERE t.id = p_terminal_id;
    ELSE
        SELECT ma.merchant_id, NULL, ma.id, ma.frozen INTO merchant_id, store_id, v_merch_acc, v_merch_frozen
          FROM wallets_account ma WHERE ma.merchant_id = p_merchant_id;
    END IF;
    IF v_merch_acc IS NULL THEN
        code := 'merchant_missing';
        RETURN;
    END IF;
    SELECT ca.id, ca.frozen,
           EXISTS (SELECT 1 FROM wallets_asset WHERE wallets_asset.code = p_asset),
           (SELECT cap FROM wallets_asset WHERE wallets_asset.code = p_points_asset),
           (SELECT cap FROM wallets_asset WHERE wallets_asset.code = p_carbon_asset),
           (SELECT id FROM wallets_account WHERE system_role = 'bonus_pool'),
           (SELECT id FROM wallets_account WHERE system_role = 'carbon_registry')
      INTO v_cust_acc, v_cust_frozen, v_asset_known, v_points_cap, v_carbon_cap, v_bonus_acc, v_registry_acc
      FROM wallets_account ca WHERE ca.customer_id = p_customer_id;
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

    INSERT INTO wallets_ledgertransaction (id, kind, reference, created) VALUES (p_txn_id, 'payment', p_payment_id, v_now);
    INSERT INTO wallets_ledgerentry (transaction_id, account_id, asset_id, amount, created)
    SELECT p_txn_id, e.account_id, e.asset_id, e.amount, v_now
      FROM (VALUES (v_cust_acc, p_asset, -p_amount), (v_merch_acc, p_asset, p_amount),
                   (v_cust_acc, p_points_asset, points), (v_bonus_acc, p_points_asset, -points),
                   (v_cust_acc, p_carbon_asset, grams), (v_registry_acc, p_carbon_asset, -grams)) AS e(account_id, asset_id, amount)
     WHERE e.amount <> 0;

    INSERT INTO payments_payment (id, status, customer_id, merchant_id, store_id, terminal_id, asset_id, amount, amount_refunded,
                                  points_earned, points_reversed, carbon_grams, carbon_grams_reversed, ledger_transaction_id, created)
    VALUES (p_payment_id, 'succeeded', p_customer_id, merchant_id, store_id, p_terminal_id, p_asset, p_amount, 0,
            points, 0, grams, 0, p_txn_id, v_now);

    INSERT INTO payments_outboxevent (id, topic, payload, created, published_at, attempts, last_error)
    VALUES (p_event_id, 'payment.succeeded',
            jsonb_build_object('id', p_payment_id, 'object', 'payment', 'status', 'succeeded', 'asset', p_asset,
                               'amount', p_amount, 'customer', p_customer_id, 'merchant', merchant_id, 'store', store_id,
                               'terminal', p_terminal_id, 'points_earned', points, 'carbon_grams', grams,
                               'created', floor(extract(epoch FROM v_now))::bigint),
            v_now, NULL, 0, '');

    IF grams > 0 THEN
        INSERT INTO wallets_carbonimpact AS c (account_id, shard, grams)
        VALUES (v_cust_acc, 0, grams), (v_merch_acc, v_shard, grams)
        ON CONFLICT (account_id, shard) DO UPDATE SET grams = c.grams + EXCLUDED.grams;
    END IF;
    code := 'ok';
END;
$$;
"""

BACKWARD = """
DROP FUNCTION IF EXISTS tally_payment_create(text, text, text, text, text, text, text, bigint, bigint, bigint, text, text, integer);
DROP FUNCTION IF EXISTS tally_customer_reward_credit(text, text, bigint, bigint);
"""


class Migration(migrations.Migration):
    dependencies = [("payments", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD, elidable=True)]
