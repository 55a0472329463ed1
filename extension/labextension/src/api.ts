/**
 * Every call to the server extension goes through JupyterLab's ServerConnection,
 * which adds the server's token and the XSRF header as the server requires.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** An answer of the API other than 2xx, with the API's own code and message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string
  ) {
    super(message);
  }
}

/**
 * `GET` (or `init.method`) `<base>/clustersdk/api/<path>`; the parsed JSON body.
 * Throws ApiError: the API's `{error, message}` for a 4xx/5xx, status 0 when the
 * server can't be reached.
 */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  query: Record<string, string | number | undefined> = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const params = Object.entries(query)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`)
    .join('&');
  const url =
    URLExt.join(settings.baseUrl, 'clustersdk', 'api', path) + (params ? `?${params}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(0, 'network', `the Jupyter server can't be reached: ${String(error)}`);
  }
  const text = await response.text();
  let body: any = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = body?.message ?? (text || response.statusText);
    throw new ApiError(response.status, body?.error ?? 'error', message);
  }
  return body as T;
}

/** POST an action (pause, resume, ...) for a job; the job's record afterwards. */
export function postAction<T>(job: string, action: string, body?: object): Promise<T> {
  return requestAPI<T>(`jobs/${encodeURIComponent(job)}/${action}`, {
    method: 'POST',
    body: body ? JSON.stringify(body) : ''
  });
}
