/**
 * Event rows (serializeEventRow lines) off the JS heap.
 * RowBuffer: a batch's rows UTF-8 encoded into a growing Buffer as they arrive, in the analysis
 * thread. Its memory is never Node's shared Buffer pool (allocUnsafeSlow): the
 * analysis thread hands a batch's rows to the main thread by transferring their ArrayBuffer, and a
 * pooled one cannot be transferred (Node 20 silently copies the whole pool; Node 22 and later refuse
 * the message).
 * RowChunks: a flush's rows, as the buffers they came in, never copied into one (see there).
 */
/** Rows [start, end) by byte position in a RowChunks, `rows` of them. */
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

  /** Bytes written so far: where the next row will start. */
  get byteLength(): number {
    return this.length;
  }

  /** The rows written so far, newline-terminated. A view: do not append after taking it. */
  bytes(): Buffer {
    return this.buffer.subarray(0, this.length);
  }

  /**
   * The rows written so far, in memory of their own size when the buffer has much more room than
   * they take (a quarter more, and 4 KiB): for rows that are held a while, as the write buffer holds a
   * batch's until they are stored, which would otherwise hold the whole buffer (a batch of repeats
   * leaves a buffer sized to its messages nearly empty).
   */
  trimmedBytes(): Buffer {
    if (this.buffer.length - this.length <= Math.max(4096, this.length / 4)) return this.bytes();
    const trimmed = Buffer.allocUnsafeSlow(this.length);
    this.buffer.copy(trimmed, 0, 0, this.length);
    return trimmed;
  }

  private grow(minimum: number): void {
    const next = Buffer.allocUnsafeSlow(Math.max(minimum, this.buffer.length * 2));
    this.buffer.copy(next, 0, 0, this.length);
    this.buffer = next;
  }
}

/**
 * A flush's rows, as the buffers they were added in (a batch's RowBuffer bytes from the analysis
 * thread, a post's lines encoded together), in order, never copied into one: the insert takes them as
 * they are (ClickHouse.insert). Copying every batch's rows into one buffer that grew by doubling, into
 * memory the kernel had to page in, cost the main thread about a tenth of its time at full intake.
 */
export class RowChunks {
  private chunks: Uint8Array[] = [];
  private length = 0;
  private count = 0;

  get rows(): number {
    return this.count;
  }

  /** Bytes held: where the next chunk's rows will start. */
  get byteLength(): number {
    return this.length;
  }

  /** Appends newline-terminated rows as they are: `bytes` is kept, not copied, and must not change. */
  appendEncoded(bytes: Uint8Array, rowCount: number): void {
    if (bytes.length === 0) return;
    this.chunks.push(bytes);
    this.length += bytes.length;
    this.count += rowCount;
  }

  /** Appends rows given as text, encoded into one chunk of their size. */
  appendLines(lines: readonly string[]): void {
    if (lines.length === 0) return;
    const bytes = Buffer.allocUnsafeSlow(lines.reduce((total, line) => total + Buffer.byteLength(line) + 1, 0));
    let at = 0;
    for (const line of lines) {
      at += bytes.write(line, at, 'utf8');
      bytes[at++] = 0x0a;
    }
    this.appendEncoded(bytes, lines.length);
  }

  /**
   * Removes rows by byte range (ranges in order, not overlapping; each range's `rows` are the rows it
   * holds). Later rows move down by the bytes removed. A range may cover chunks whole or in part: the
   * rest of a chunk stays, as a view of it, so nothing is copied.
   */
  remove(ranges: readonly RowRange[]): void {
    const kept: Uint8Array[] = [];
    let position = 0; // where the chunk in hand starts
    let next = 0; // the first range not wholly before it
    for (const chunk of this.chunks) {
      const end = position + chunk.length;
      let from = position; // the chunk's bytes before this are kept or removed already
      while (next < ranges.length && ranges[next]!.start < end) {
        const range = ranges[next]!;
        if (range.start > from) kept.push(chunk.subarray(from - position, range.start - position));
        from = Math.max(from, Math.min(range.end, end));
        if (range.end > end) break; // it goes on into the next chunk
        next++;
      }
      if (from < end) kept.push(chunk.subarray(from - position, end - position));
      position = end;
    }
    this.chunks = kept;
    this.length = kept.reduce((total, chunk) => total + chunk.length, 0);
    this.count -= ranges.reduce((total, range) => total + range.rows, 0);
  }

  /** The rows, in order, as the chunks they were added in (not to be written to); later appends and removals leave it as it is. */
  bytes(): readonly Uint8Array[] {
    return [...this.chunks];
  }
}
