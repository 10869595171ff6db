-- An insert can land although the worker is told it failed (a server's request timeout, a connection
-- reset after the commit). The buffer then stores the same flush again: its raw rows collapse on
-- merge, but the views would count it twice. With a deduplication window a table keeps the ids of its
-- latest inserted blocks, and the worker inserts every attempt of a flush under the flush's own
-- insert_deduplication_token (event-buffer.ts, EventStore.insertRows): a repeat is dropped. Each
-- view's table needs a window of its own, since ClickHouse pushes the block request_events dropped
-- through the views, which drop it only by their own ids (derived from the source block's, so equal
-- view rows of two different inserts are both kept). Inserts without a token are compared by their
-- rows, which repeat only when the rows are duplicates anyway.
-- The window counts blocks, one per partition an insert touches (a day of request_events and
-- key_networks_1d, a month of the rollup), of every replica writing to the table. A retry comes
-- within seconds of its attempt's failure (a timeout: 60 s after it started); 10 replicas storing a
-- flush a second, of one or two days each, take 8 to 16 minutes to fill 10,000. Tokens are unique
-- per flush, so a wide window never drops another flush; it costs nothing measurable per insert.
ALTER TABLE {{db}}.request_events MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE {{db}}.request_rollup_1m MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE {{db}}.key_networks_1d MODIFY SETTING non_replicated_deduplication_window = 10000;
