-- The store's tables. Migrate runs this with search_path set to the
-- store's schema. Times are Unix nanoseconds (bigint): the store's clock is
-- the caller's (queue.Options.Now), and nanoseconds keep its values exact.

-- Enqueue order (List, and Claim among rows due at the same time).
CREATE SEQUENCE envelope_seq;
-- Lease fences: never reused, never backwards, across restarts.
CREATE SEQUENCE fence_seq;
-- Push subscriptions in the order they were saved.
CREATE SEQUENCE subscription_seq;

CREATE TABLE envelopes (
	tenant      text   NOT NULL,
	id          text   NOT NULL,
	seq         bigint NOT NULL UNIQUE,
	user_id     text   NOT NULL,
	channel     text   NOT NULL,
	template    text   NOT NULL,
	addr_target text   NOT NULL, -- queue.AddressTarget: where its address suppression is looked up
	segments    int    NOT NULL CHECK (segments > 0),
	enqueued_ns bigint NOT NULL,
	body        bytea  NOT NULL, -- the envelope's JSON encoding, as stored
	PRIMARY KEY (tenant, id)    -- idempotency
);
CREATE INDEX envelopes_user ON envelopes (tenant, user_id);

-- One row per segment. Every column but the keys and lane/wake_ns/terminal
-- is a queue.Delivery; lane, wake_ns and terminal are derived from it by the
-- store (Delivery.WakeAt, State.Terminal) so that claims, recoveries,
-- NextDue and Prune find their rows through an index.
CREATE TABLE deliveries (
	tenant       text     NOT NULL,
	env_id       text     NOT NULL,
	seg          int      NOT NULL,
	env_seq      bigint   NOT NULL,
	channel      text     NOT NULL,
	state        text     NOT NULL,
	attempts     int      NOT NULL,
	budget       int      NOT NULL,
	class        text     NOT NULL,
	receipt      text     NOT NULL,
	due_ns       bigint,
	owner        text     NOT NULL,
	fence        bigint   NOT NULL,
	lease_end_ns bigint,
	from_state   text     NOT NULL,
	to_pending   boolean  NOT NULL,
	updated_ns   bigint   NOT NULL,
	history      jsonb,
	lane         smallint NOT NULL, -- 0 nothing due, 1 due to be claimed, 2 leased
	wake_ns      bigint,            -- Delivery.WakeAt, while lane > 0
	terminal     boolean  NOT NULL,
	PRIMARY KEY (tenant, env_id, seg),
	FOREIGN KEY (tenant, env_id) REFERENCES envelopes ON DELETE CASCADE
);
CREATE INDEX deliveries_wake ON deliveries (lane, wake_ns, env_seq, seg) WHERE lane > 0;
CREATE INDEX deliveries_order ON deliveries (env_seq, seg);
CREATE INDEX deliveries_tenant_order ON deliveries (tenant, env_seq, seg);

CREATE TABLE consents (
	tenant         text    NOT NULL,
	user_id        text    NOT NULL,
	digest_enabled boolean NOT NULL,
	push_enabled   boolean NOT NULL,
	email_verified boolean NOT NULL,
	cadence        text    NOT NULL,
	suppressions   jsonb   NOT NULL,
	updated_ns     bigint  NOT NULL,
	PRIMARY KEY (tenant, user_id)
);

-- Every consent record as it was written, oldest first (erased with the user).
CREATE TABLE consent_history (
	n          bigserial PRIMARY KEY,
	tenant     text   NOT NULL,
	user_id    text   NOT NULL,
	at_ns      bigint NOT NULL,
	record     jsonb  NOT NULL
);
CREATE INDEX consent_history_user ON consent_history (tenant, user_id);

-- A tenant's address suppressions, by target (the address is never stored).
CREATE TABLE address_suppressions (
	tenant  text   NOT NULL,
	target  text   NOT NULL,
	channel text   NOT NULL,
	reason  text   NOT NULL,
	at_ns   bigint NOT NULL,
	PRIMARY KEY (tenant, target)
);

CREATE TABLE subscriptions (
	tenant     text   NOT NULL,
	user_id    text   NOT NULL,
	endpoint   text   NOT NULL,
	seq        bigint NOT NULL,
	sub        jsonb  NOT NULL,
	created_ns bigint NOT NULL,
	PRIMARY KEY (tenant, user_id, endpoint)
);
