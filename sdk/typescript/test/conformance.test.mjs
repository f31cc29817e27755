// Runs sdk/conformance/scenario.json through the SDK, step by step, as
// sdk/conformance/README.md defines it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from './airlock-server.mjs';
import { useAirlock, runId, sdk } from './helpers.mjs';

// AIRLOCK_CONFORMANCE_SCENARIO names another scenario file (e.g. a newer one).
const scenarioPath = process.env.AIRLOCK_CONFORMANCE_SCENARIO || join(repoRoot, 'sdk', 'conformance', 'scenario.json');
const scenario = JSON.parse(readFileSync(scenarioPath, 'utf8'));
const ctx = await useAirlock();

const errorClasses = {
  not_found: sdk.NotFoundError,
  conflict: sdk.ConflictError,
  invalid: sdk.InvalidRequestError,
  quota_exceeded: sdk.QuotaExceededError,
};

// The expect keys each step may have (README, "Steps"); "error" is allowed everywhere.
const allowedExpect = {
  create: ['state', 'template', 'metadata'],
  get: ['state'],
  list: ['ids'],
  run: ['exit_code', 'stdout', 'stderr', 'timed_out'],
  write_file: ['size'],
  read_file: ['data'],
  list_files: ['names'],
  stat: ['type', 'size', 'name'],
  mkdir: ['type'],
  move: ['name'],
  remove: [],
  pause: ['state'], resume: ['state'], suspend: ['state'], wake: ['state'], delete: ['state'],
};

function substitute(v, vars) {
  if (typeof v === 'string') return v.replace(/\$\{(run|sdk|sandbox)\}/g, (_, k) => vars[k] ?? '');
  if (Array.isArray(v)) return v.map((x) => substitute(x, vars));
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, substitute(x, vars)]));
  return v;
}

test('conformance scenario', { timeout: 20 * 60_000 }, async (t) => {
  if (ctx.skip) return t.skip(ctx.skip);
  assert.equal(scenario.version, 1);
  t.diagnostic(`scenario ${scenarioPath}: ${scenario.steps.length} steps`);
  const c = ctx.client;
  const vars = { run: runId(), sdk: 'typescript', sandbox: '' };
  let current; // the current sandbox
  const created = [];
  try {
    for (const [i, raw] of scenario.steps.entries()) {
      const name = `step ${i + 1} "${raw.name}" (${raw.do})`;
      const allowed = allowedExpect[raw.do];
      assert.ok(allowed, `${name}: unknown step kind ${raw.do}`);
      const expect = substitute(raw.expect ?? {}, vars);
      for (const k of Object.keys(expect)) {
        if (k !== 'error' && !allowed.includes(k)) assert.fail(`${name}: expect key ${JSON.stringify(k)} is not defined for ${raw.do}`);
      }
      const args = substitute(raw.args ?? {}, vars);
      const sbOf = async () => (args.id ? await c.sandboxes.get(args.id) : current);
      const t0 = Date.now();
      let result;
      try {
        result = await runStep(raw.do, args, sbOf, c, (sb) => {
          current = sb;
          vars.sandbox = sb.id;
          created.push(sb);
        });
      } catch (err) {
        if (expect.error) {
          const cls = errorClasses[expect.error];
          assert.ok(cls, `${name}: unknown error class ${expect.error}`);
          assert.ok(err instanceof cls, `${name}: want ${cls.name}, got ${err?.name}: ${err?.message}`);
          t.diagnostic(`${name}: ${cls.name} as expected (${Date.now() - t0} ms)`);
          continue;
        }
        throw new Error(`${name} failed: ${err?.name}: ${err?.message}`, { cause: err });
      }
      if (expect.error) assert.fail(`${name}: want ${expect.error} error, the step succeeded with ${JSON.stringify(result)}`);
      // Substitute ${sandbox} again: create sets it during the step.
      check(name, raw.do, substitute(raw.expect ?? {}, vars), result);
      t.diagnostic(`${name}: ok (${Date.now() - t0} ms)`);
    }
  } finally {
    for (const sb of created) {
      await sb.delete().catch(() => {});
    }
  }
});

async function runStep(kind, args, sbOf, c, setCurrent) {
  const sb = await sbOf();
  switch (kind) {
    case 'create': {
      const s = await c.sandboxes.create({ template: args.template, metadata: args.metadata, env: args.env });
      setCurrent(s);
      return { state: s.state, template: s.template, metadata: s.metadata };
    }
    case 'get': {
      const s = args.id ? sb : await c.sandboxes.get(sb.id);
      return { state: s.state };
    }
    case 'list': {
      const ids = [];
      for await (const s of c.sandboxes.list({ metadata: args.metadata })) ids.push(s.id);
      return { ids };
    }
    case 'run': {
      const r = await sb.commands.run(args.cmd ?? '', { argv: args.argv, env: args.env, cwd: args.cwd, stdin: args.stdin, timeoutS: args.timeout_s });
      return { exit_code: r.exitCode, stdout: r.stdout, stderr: r.stderr, timed_out: r.timedOut };
    }
    case 'write_file': {
      const fi = await sb.files.write(args.path, args.data);
      return { size: fi.size };
    }
    case 'read_file':
      return { data: await sb.files.read(args.path) };
    case 'list_files':
      return { names: (await sb.files.list(args.path)).map((e) => e.name) };
    case 'stat': {
      const fi = await sb.files.stat(args.path);
      return { type: fi.type, size: fi.size, name: fi.name };
    }
    case 'mkdir':
      return { type: (await sb.files.mkdir(args.path)).type };
    case 'move':
      return { name: (await sb.files.move(args.from, args.to)).name };
    case 'remove':
      await sb.files.remove(args.path, { recursive: args.recursive });
      return {};
    case 'pause':
    case 'resume':
    case 'suspend':
    case 'wake':
    case 'delete': {
      await sb[kind]();
      const s = await c.sandboxes.get(sb.id);
      return { state: s.state };
    }
  }
  throw new Error(`unknown step kind ${kind}`);
}

function check(name, kind, expect, got) {
  for (const [k, want] of Object.entries(expect)) {
    if (kind === 'create' && k === 'metadata') {
      for (const [mk, mv] of Object.entries(want)) assert.equal(got.metadata?.[mk], mv, `${name}: metadata ${mk}`);
      continue;
    }
    if (kind === 'run' && k === 'timed_out') {
      assert.equal(!!got.timed_out, want, `${name}: timed_out`);
      continue;
    }
    assert.deepEqual(got[k], want, `${name}: ${k}`);
  }
}
