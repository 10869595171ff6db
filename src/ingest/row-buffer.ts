/**
 * Event rows (serializeEventRow lines) accumulated off the JS heap: each row is UTF-8 encoded into a growing Buffer as
 * it arrives, so a flush neither joins tens of thousands of strings nor copies a large string into
 * a Buffer (both showed up as garbage-collector time on the ingest path).
 * Its memory is never Node's shared Buffer pool (allocUnsafeSlow): the analysis thread hands a
 * batch's rows to the main thread by transferring their ArrayBuffer, and a pooled one cannot be
 * transferred (Node 20 silently copies the whole pool; Node 22 and later refuse the message).
 */
/** Rows [start, end) by byte position in a RowBuffer, `rows` of them. */
export interface RowRange {
  start: number;
  end: number;
  rows: number;
}

export class RowBuffer {
  private buffer: Buffer;
  private length = 0;
  private count = 0;
  /** Where reserveRow's room ends; -1 when no row is reserved. */
  private reservedEnd = -1;

  constructor(initialBytes = 1 << 20) {
    this.buffer = Buffer.allocUnsafeSlow(initialBytes);
  }

  get rows(): number {
    return this.count;
  }

  append(row: string): void {
    // A UTF-8 character takes at most 3 bytes per UTF-16 unit; +1 for the newline.
    const worstCase = row.length * 3 + 1;
    if (this.length + worstCase > this.buffer.length) this.grow(this.length + worstCase);
    this.length += this.buffer.write(row, this.length, 'utf8');
    this.buffer[this.length++] = 0x0a;
    this.count++;
  }

  /**
   * Makes room for a row of at most `maxBytes`, which the caller writes into `target` (read after this
   * call: making room may replace it) from the position returned, then ends with commitRow, with no
   * other append in between.
   */
  reserveRow(maxBytes: number): number {
    if (this.length + maxBytes + 1 > this.buffer.length) this.grow(this.length + maxBytes + 1);
    this.reservedEnd = this.length + maxBytes;
    return this.length;
  }

  /** Where reserveRow's caller writes. */
  get target(): Buffer {
    return this.buffer;
  }

  /** Ends the row written from reserveRow's position up to `end` (newline added). */
  commitRow(end: number): void {
    // Past the reservation, writes beyond the buffer's end may have been dropped: a bug, not a row to store.
    if (end > this.reservedEnd || end < this.length) throw new Error(`row of ${end - this.length} bytes outside its reservation of ${this.reservedEnd - this.length}`);
    this.length = end;
    this.buffer[this.length++] = 0x0a;
    this.count++;
    this.reservedEnd = -1;
  }

  /** Appends rows that are already encoded (newline-terminated rows). */
  appendEncoded(bytes: Uint8Array, rowCount: number): void {
    if (this.length + bytes.length > this.buffer.length) this.grow(this.length + bytes.length);
    this.buffer.set(bytes, this.length);
    this.length += bytes.length;
    this.count += rowCount;
  }

  /** Bytes written so far: where the next row will start. */
  get byteLength(): number {
    return this.length;
  }

  /** Removes whole rows by byte range (ranges in order, not overlapping), moving later rows down. */
  remove(ranges: readonly RowRange[]): void {
    let removedBytes = 0;
    ranges.forEach((range, i) => {
      const nextStart = ranges[i + 1]?.start ?? this.length;
      this.buffer.copyWithin(range.start - removedBytes, range.end, nextStart);
      removedBytes += range.end - range.start;
      this.count -= range.rows;
    });
    this.length -= removedBytes;
  }

  /** Forgets every row, keeping the memory (already paged in) for the next rows: views taken before (bytes()) may show them. */
  clear(): void {
    this.length = 0;
    this.count = 0;
    this.reservedEnd = -1;
  }

  /** The rows written so far, newline-terminated. A view: do not append after taking it. */
  bytes(): Buffer {
    return this.buffer.subarray(0, this.length);
  }

  private grow(minimum: number): void {
    const next = Buffer.allocUnsafeSlow(Math.max(minimum, this.buffer.length * 2));
    this.buffer.copy(next, 0, 0, this.length);
    this.buffer = next;
  }
}
