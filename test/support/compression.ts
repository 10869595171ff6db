/** Compressed batches as other Kafka clients write them, for tests of the worker's reading. */
import { compressSync as snappyCompressSync } from 'snappy';

const XERIAL_HEADER = [0x82, 0x53, 0x4e, 0x41, 0x50, 0x50, 0x59, 0x00, 0, 0, 0, 1, 0, 0, 0, 1];

/** snappy-java's stream format, as the Java client writes a batch: the header, then length-prefixed raw snappy blocks. */
export function xerialFramed(plain: Buffer, blockBytes = 32 * 1024): Buffer {
  const parts: Buffer[] = [Buffer.from(XERIAL_HEADER)];
  for (let offset = 0; offset < plain.length; offset += blockBytes) {
    const block = snappyCompressSync(plain.subarray(offset, offset + blockBytes));
    const length = Buffer.alloc(4);
    length.writeUInt32BE(block.length);
    parts.push(length, block);
  }
  return Buffer.concat(parts);
}
