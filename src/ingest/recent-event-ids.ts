/**
 * A bounded memory of recently accepted eventIds, so an event published twice (a producer retry,
 * an HTTP client retrying a timed-out post) is stored and counted once. Kafka redelivery after a
 * restart is handled by stored offsets, not by this memory. What this process did not take in is
 * recalled from storage: the ids of events posted without Kafka at start (main.ts), and those of a
 * partition's events when an assignment brings it (kafka-consumer.ts).
 *
 * Two generations of half the capacity each: ids go into the current one; when it is full it becomes
 * the previous one and the oldest generation is dropped whole. That remembers between capacity/2 and
 * capacity recent ids, at the cost of two lookups and no per-id eviction.
 *
 * A generation keeps 63-bit fingerprints of the ids in typed arrays, not the strings: it runs on
 * every event, and a Set of 200k strings made the garbage collector copy and trace every id it held
 * (about a tenth of the analysis thread's time). Two different ids share a fingerprint with
 * probability 2^-63, so with 200k ids remembered a new event is mistaken for a repeat about once in
 * 4·10^13 events.
 *
 * Each id is remembered with the Kafka partition it came from (-1 for HTTP), so that a replica that
 * loses a partition can forget its ids: the rows it had not stored yet are dropped, and if the
 * partition comes back they are delivered again and must not look like repeats.
 */
export class RecentEventIds {
  private current: FingerprintTable;
  private previous: FingerprintTable;
  private readonly generationSize: number;

  constructor(capacity: number) {
    this.generationSize = Math.max(0, Math.ceil(capacity / 2));
    this.current = new FingerprintTable(this.generationSize);
    this.previous = new FingerprintTable(this.generationSize);
  }

  /** Records the id; returns true when it was already recorded (a duplicate). */
  checkAndAdd(eventId: string, partition = -1): boolean {
    if (this.generationSize === 0) return false;
    const [high, low] = fingerprint(eventId);
    return this.checkAndAddFingerprint(high, low, partition);
  }

  /** checkAndAdd for an id in ASCII bytes[start, end), without making it a string (the same fingerprint as the id's). */
  checkAndAddAscii(bytes: Uint8Array, start: number, end: number, partition = -1): boolean {
    if (this.generationSize === 0) return false;
    const [high, low] = asciiFingerprint(bytes, start, end);
    return this.checkAndAddFingerprint(high, low, partition);
  }

  private checkAndAddFingerprint(high: number, low: number, partition: number): boolean {
    if (this.current.has(high, low) || this.previous.has(high, low)) return true;
    if (this.current.size >= this.generationSize) {
      const dropped = this.previous;
      this.previous = this.current;
      this.current = dropped;
      this.current.clear();
    }
    this.current.add(high, low, partition);
    return false;
  }

  /** Whether the id is recorded, without recording it. */
  has(eventId: string): boolean {
    if (this.generationSize === 0) return false;
    const [high, low] = fingerprint(eventId);
    return this.current.has(high, low) || this.previous.has(high, low);
  }

  /** Forgets the ids of every partition not in `partitions`. */
  keepPartitions(partitions: ReadonlySet<number>): void {
    this.current.retain(partitions);
    this.previous.retain(partitions);
  }

  get size(): number {
    return this.current.size + this.previous.size;
  }
}

/** Open addressing with linear probing over (high, low) pairs; a pair of zeros is an empty slot. */
class FingerprintTable {
  /** slots[2i] and slots[2i+1]: the high and low halves of slot i's fingerprint. */
  private readonly slots: Int32Array;
  /** partitions[i]: the partition of slot i's id. */
  private readonly partitions: Int32Array;
  private readonly mask: number;
  size = 0;

  /** Room for `capacity` fingerprints at a load of at most one half. */
  constructor(capacity: number) {
    let length = 2;
    while (length < capacity * 2) length *= 2;
    this.slots = new Int32Array(length * 2);
    this.partitions = new Int32Array(length);
    this.mask = length - 1;
  }

  has(high: number, low: number): boolean {
    const slots = this.slots;
    for (let at = high & this.mask; slots[2 * at + 1] !== 0; at = (at + 1) & this.mask) {
      if (slots[2 * at] === high && slots[2 * at + 1] === low) return true;
    }
    return false;
  }

  /** Adds a fingerprint known not to be in the table. */
  add(high: number, low: number, partition: number): void {
    const slots = this.slots;
    let at = high & this.mask;
    while (slots[2 * at + 1] !== 0) at = (at + 1) & this.mask;
    slots[2 * at] = high;
    slots[2 * at + 1] = low;
    this.partitions[at] = partition;
    this.size++;
  }

  /** Keeps the fingerprints of these partitions only (rebuilt: linear probing has no cheap delete). */
  retain(partitions: ReadonlySet<number>): void {
    const kept: number[] = [];
    for (let at = 0; at <= this.mask; at++) {
      if (this.slots[2 * at + 1] !== 0 && partitions.has(this.partitions[at]!)) kept.push(this.slots[2 * at]!, this.slots[2 * at + 1]!, this.partitions[at]!);
    }
    if (kept.length / 3 === this.size) return;
    this.clear();
    for (let i = 0; i < kept.length; i += 3) this.add(kept[i]!, kept[i + 1]!, kept[i + 2]!);
  }

  clear(): void {
    this.slots.fill(0);
    this.size = 0;
  }
}

const pair: [number, number] = [0, 0];

/**
 * Two independent 32-bit hashes of the id's UTF-16 units (FNV-1a and a murmur-style multiply, each
 * finished by murmur3's avalanche), as one 63-bit fingerprint: the low half is never 0, which marks
 * an empty slot. Returns a shared pair: read it before the next call.
 */
function fingerprint(id: string): [number, number] {
  let a = 0x811c9dc5;
  let b = 0x9747b28c ^ id.length;
  for (let i = 0; i < id.length; i++) {
    const unit = id.charCodeAt(i);
    a = Math.imul(a ^ unit, 0x01000193);
    b = Math.imul(b ^ unit, 0x5bd1e995);
    b ^= b >>> 15;
  }
  return finished(a, b);
}

/** fingerprint() of the id whose characters are the ASCII bytes[start, end): a byte is its UTF-16 unit. */
function asciiFingerprint(bytes: Uint8Array, start: number, end: number): [number, number] {
  let a = 0x811c9dc5;
  let b = 0x9747b28c ^ (end - start);
  for (let i = start; i < end; i++) {
    const unit = bytes[i]!;
    a = Math.imul(a ^ unit, 0x01000193);
    b = Math.imul(b ^ unit, 0x5bd1e995);
    b ^= b >>> 15;
  }
  return finished(a, b);
}

function finished(a: number, b: number): [number, number] {
  pair[0] = avalanche(a);
  pair[1] = avalanche(b) | 1;
  return pair;
}

function avalanche(hash: number): number {
  hash ^= hash >>> 16;
  hash = Math.imul(hash, 0x85ebca6b);
  hash ^= hash >>> 13;
  hash = Math.imul(hash, 0xc2b2ae35);
  return hash ^ (hash >>> 16);
}
