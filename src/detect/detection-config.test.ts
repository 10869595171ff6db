import { describe, expect, it } from 'vitest';
import { DetectionConfig, firstNonJsonOffset, jsonErrorPosition, lineAndColumn } from './detection-config.ts';

/** Text that must never reach an error message: a secret file named as the config by mistake. */
const SECRET = 'Zq8vN2kR7xW4pL9tB3mH6cJ1yF5sD0gA';

/** JSON.parse's message for `text` on the Node running the test. */
function parseMessage(text: string): string {
  try {
    JSON.parse(text);
  } catch (error) {
    return (error as Error).message;
  }
  throw new Error(`${JSON.stringify(text)} is JSON`);
}

// Broken texts, with the offset at which each stops being JSON.
const BROKEN: [what: string, text: string, offset: number][] = [
  ['a bare word', 'abc', 0],
  ['a word in place of a value', '{"a": tru}', 9],
  ['a bare word after a line break', '{\n  "a": 1,\n  b: 2\n}', 14],
  ['a trailing comma', '{"a":1,}', 7],
  ['a missing comma', '[1 2]', 3],
  ['a leading zero', '{"a":01}', 6],
  ['a minus sign without a number', '{"a":-}', 6],
  ['a fraction without digits', '{"a":1.}', 7],
  ['an exponent without digits', '{"a":1e}', 7],
  ['a bad escape', '{"a":"b\\q"}', 8],
  ['a short unicode escape', '{"a":"\\u12"}', 10],
  ['a raw line break in a string', '{"a":"x\ny"}', 7],
  ['an unterminated string', '"abc', 4],
  ['an early end', '{"a": 1', 7],
  ['nothing', '', 0],
  ['only whitespace', ' \n ', 3],
  ['text after the value', '{"a":1} x', 8],
  ['a single-quoted string', "{'a': 1}", 1],
  ['a comment', '{"a": 1 // why\n}', 8],
  ['a byte-order mark', '\uFEFF{}', 0],
];

describe('firstNonJsonOffset', () => {
  it.each(BROKEN)('finds where the text stops being JSON: %s', (_, text, offset) => {
    expect(firstNonJsonOffset(text)).toBe(offset);
  });

  // On the Node that runs it: V8 states a position in every message but those two kinds.
  it.each(BROKEN)('agrees with the position JSON.parse states, where it states one: %s', (_, text) => {
    const message = parseMessage(text);
    const stated = /at position (\d+)/.exec(message)?.[1];
    if (stated === undefined) expect(message).toMatch(/^Unexpected token |^Unexpected end of JSON input$/);
    else expect(firstNonJsonOffset(text)).toBe(Number(stated));
  });

  it.each(['{}', '[]', ' {"a": [1, -2.5e+3, 0, true, false, null, "x\\"\\u00e9\\n"], "b": {}} ', '"text"', '0'])('finds nothing wrong in JSON: %s', (text) => {
    expect(JSON.parse(text)).toBeDefined();
    expect(firstNonJsonOffset(text)).toBeUndefined();
  });

  it('gives up, saying nothing, on nesting deeper than the stack allows', () => {
    expect(firstNonJsonOffset(`${'['.repeat(1_000_000)}x`)).toBeUndefined();
  });
});

describe('jsonErrorPosition and lineAndColumn', () => {
  const text = '{\n  "allowlist": {},\n  x: 1\n}';
  it.each([
    ['Node 20', "Expected double-quoted property name in JSON at position 23"],
    ['Node 22 and later', "Expected double-quoted property name in JSON at position 23 (line 3 column 3)"],
    ['a message that states no position', `Unexpected token 'x', ..."list": {},\n  x: 1\n}" is not valid JSON`],
  ])('reads the line and column of a message from %s', (_, message) => {
    expect(lineAndColumn(text, jsonErrorPosition(text, message)!)).toEqual({ line: 3, column: 3 });
  });

  it('takes the position the message states over the syntax check', () => {
    expect(jsonErrorPosition('[1 2]', 'Expected \',\' or \']\' after array element in JSON at position 4')).toBe(4);
  });

  it.each([
    [0, { line: 1, column: 1 }],
    [3, { line: 1, column: 4 }],
    [4, { line: 2, column: 1 }],
    [7, { line: 3, column: 1 }],
  ])('counts lines at \\n, also after \\r\\n: position %i', (position, where) => {
    expect(lineAndColumn('abc\nd\r\nef', position)).toEqual(where);
  });
});

describe('DetectionConfig.parse of a file that is not JSON', () => {
  it.each([
    ['a bare word at the start (V8 states no position)', `${SECRET}\n`, 'not valid JSON at line 1, column 1'],
    ['a bare word in place of a value (V8 states no position)', `{\n  "allowlist": {\n    "keys": [${SECRET}]\n  }\n}`, 'not valid JSON at line 3, column 14'],
    ['a string running to its end', `{"allowlist": {"keys": ["${SECRET}`, 'not valid JSON at line 1, column 58'],
    ['a property without quotes', `{\n  "allowlist": {},\n  ${SECRET}: 1\n}`, 'not valid JSON at line 3, column 3'],
  ])('names the line and column, never quoting the file: %s', (_, text, message) => {
    expect(() => DetectionConfig.parse(text)).toThrow(new Error(message));
  });
});
