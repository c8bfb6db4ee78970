-- The table postgres-sink writes (it creates nothing). weir creates its own
-- two tables, weir_units and weir_applied, on first use.
CREATE TABLE IF NOT EXISTS orders (
    tenant   text    NOT NULL,
    order_id bigint  NOT NULL,
    customer text    NOT NULL,
    email    text,
    amount   numeric CONSTRAINT amount_is_positive CHECK (amount > 0),
    doc      jsonb   NOT NULL,
    PRIMARY KEY (tenant, order_id)
);
