// Sends every call of calls.json through one official Node.js SDK to an ingest API, then flushes.
// Usage: node driver.mjs SDK HOST WRITE_KEY   (SDK: one of the names in SDKS below)
// Exits 0 when the SDK reported no error, 1 otherwise (the error on stderr).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { inspect } from "node:util";

const require = createRequire(import.meta.url);
const [sdk, host, writeKey] = process.argv.slice(2);
const { calls } = JSON.parse(readFileSync(new URL("./calls.json", import.meta.url)));

// Each SDK: how to build a client, and how to flush it (a promise that rejects on a delivery error).
const SDKS = {
  "@segment/analytics-node": async () => {
    const { Analytics } = require("@segment/analytics-node");
    const client = new Analytics({ writeKey, host, flushAt: 20, maxRetries: 0 });
    const errors = [];
    client.on("error", (error) => errors.push(error));
    return [client, async () => {
      await client.closeAndFlush({ timeout: 20000 });
      if (errors.length) throw errors[0];
    }];
  },
  "analytics-node": async () => {
    const Analytics = require("analytics-node");
    const client = new Analytics(writeKey, { host, flushAt: 20, retryCount: 0 });
    return [client, () => new Promise((resolve, reject) => client.flush((error) => (error ? reject(error) : resolve())))];
  },
  "@rudderstack/rudder-sdk-node": async () => {
    const Analytics = require("@rudderstack/rudder-sdk-node");
    const errors = [];
    const client = new Analytics(writeKey, { dataPlaneUrl: host, flushAt: 20, retryCount: 0,
                                             errorHandler: (error) => errors.push(error) });
    return [client, async () => {
      await new Promise((resolve, reject) => client.flush((error) => (error ? reject(error) : resolve())));
      if (errors.length) throw errors[0];
    }];
  },
  "@rudderstack/analytics-js-service-worker": async () => {
    const { Analytics } = await import("@rudderstack/analytics-js-service-worker");
    const errors = [];
    const client = new Analytics(writeKey, host, { flushAt: 20, retryCount: 0,
                                                   errorHandler: (error) => errors.push(error) });
    return [client, async () => {
      await new Promise((resolve, reject) => client.flush((error) => (error ? reject(error) : resolve())));
      if (errors.length) throw errors[0];
    }];
  },
};

async function main() {
  if (!(sdk in SDKS)) throw new Error(`unknown SDK ${sdk}; known: ${Object.keys(SDKS).join(", ")}`);
  const [client, flush] = await SDKS[sdk]();
  for (const { type, message } of calls) {
    client[type](structuredClone(message));
  }
  await flush();
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(`${sdk}: ${inspect(error, { depth: 3 })}`);
    process.exit(1);
  },
);
