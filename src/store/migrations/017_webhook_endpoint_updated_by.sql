-- Who last registered a merchant's endpoint (its URL and secret) or removed it, beside who first
-- registered it: a replacement keeps created_by and created_at. Before this version created_by was
-- overwritten by every replacement, so a row written then holds its last registrant in both.
ALTER TABLE {{db}}.webhook_endpoints
    ADD COLUMN IF NOT EXISTS updated_by String DEFAULT created_by COMMENT 'admin user who last registered it (its URL and secret), or removed it' AFTER created_by;
