/** Loopback ports for tests. */
import { createServer, type AddressInfo } from 'node:net';

/**
 * A loopback port nothing listens on: to listen on (a spawned worker's), or to connect to and be
 * refused (a broker or a receiver that is down).
 */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
