-- Who set a user's flags last and the user's consent history (queue.Consent
-- By and History: an opt-in lifts an unsubscribe, and the history says so).
ALTER TABLE consents
	ADD COLUMN set_by  text  NOT NULL DEFAULT '',
	ADD COLUMN history jsonb NOT NULL DEFAULT '[]';
