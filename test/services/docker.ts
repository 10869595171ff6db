/** Whether a Docker engine answers: GET /_ping on its socket, at most ~2 s, no docker CLI needed. */
import { existsSync } from 'node:fs';
import { request } from 'node:http';

export async function dockerAvailable(timeoutMs = 2000): Promise<boolean> {
  const dockerHost = process.env.DOCKER_HOST;
  let target: { socketPath: string } | { host: string; port: number };
  if (!dockerHost || dockerHost.startsWith('unix://')) {
    const socketPath = dockerHost ? dockerHost.slice('unix://'.length) : '/var/run/docker.sock';
    if (!existsSync(socketPath)) return false;
    target = { socketPath };
  } else if (dockerHost.startsWith('tcp://')) {
    if (process.env.DOCKER_TLS_VERIFY) return true; // TLS endpoint: let testcontainers handle it
    const url = new URL(dockerHost.replace(/^tcp:/, 'http:'));
    target = { host: url.hostname, port: Number(url.port || 2375) };
  } else {
    return false;
  }
  return new Promise<boolean>((resolvePing) => {
    const req = request({ ...target, path: '/_ping', method: 'GET', timeout: timeoutMs }, (res) => {
      res.resume();
      resolvePing(res.statusCode === 200);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolvePing(false));
    req.end();
  });
}
