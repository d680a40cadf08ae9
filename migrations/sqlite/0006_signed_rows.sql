-- Writers' row signatures (plan 0031). A writer that signs stores, beside each row it
-- writes, `ed25519:<public key hex>:<signature hex>` over its name (the `relay`
-- column) and the row's content id. Like `relay` it is not part of the content, so
-- identical content is still one row. Readers verify it on every read; the owner
-- registers writers' keys with `!config relay-keys`.
ALTER TABLE interaction ADD COLUMN sig TEXT;
