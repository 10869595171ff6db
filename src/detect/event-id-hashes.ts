/**
 * The eventIds of one key's window, for "an eventId counts once per key", kept as 30-bit hashes in
 * an open-addressing table of small integers. Checking and adding read one array; a Set of strings
 * reads the strings of the entries it compares, and every string each time it grows, which made it
 * the engine's largest cost. Equal hashes do not prove equal ids: the caller confirms a hit against
 * the events themselves, which happens for a real repeat or a rare collision.
 */
export class EventIdHashes {
  /** Linear probing; 0 is an empty slot. The length is a power of two, at least twice the count. */
  private slots: number[] = newSlots(8);
  private count = 0;

  has(hash: number): boolean {
    const mask = this.slots.length - 1;
    for (let at = hash & mask; this.slots[at] !== 0; at = (at + 1) & mask) {
      if (this.slots[at] === hash) return true;
    }
    return false;
  }

  /** Adds one occurrence of the hash (two ids may share one). */
  add(hash: number): void {
    if ((this.count + 1) * 2 > this.slots.length) this.resize(this.slots.length * 2);
    const mask = this.slots.length - 1;
    let at = hash & mask;
    while (this.slots[at] !== 0) at = (at + 1) & mask;
    this.slots[at] = hash;
    this.count++;
  }

  /** Removes one occurrence of the hash. */
  delete(hash: number): void {
    const slots = this.slots;
    const mask = slots.length - 1;
    let at = hash & mask;
    while (slots[at] !== hash) {
      if (slots[at] === 0) return;
      at = (at + 1) & mask;
    }
    // Backward shift: later entries of the same probe run move up, so no run is broken by a hole.
    let hole = at;
    for (let next = (at + 1) & mask; slots[next] !== 0; next = (next + 1) & mask) {
      const home = slots[next]! & mask;
      // The entry may fill the hole unless its home lies cyclically in (hole, next].
      if (hole <= next ? home <= hole || home > next : home <= hole && home > next) {
        slots[hole] = slots[next]!;
        hole = next;
      }
    }
    slots[hole] = 0;
    this.count--;
  }

  private resize(length: number): void {
    const old = this.slots;
    this.slots = newSlots(length);
    this.count = 0;
    for (const hash of old) if (hash !== 0) this.add(hash);
  }
}

/** FNV-1a over the id's UTF-16 units, folded to 30 bits (a small integer for V8) and never 0. */
export function eventIdHash(eventId: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < eventId.length; i++) hash = Math.imul(hash ^ eventId.charCodeAt(i), 0x01000193);
  return (hash >>> 2) || 1;
}

function newSlots(length: number): number[] {
  const slots: number[] = [];
  for (let i = 0; i < length; i++) slots.push(0);
  return slots;
}
