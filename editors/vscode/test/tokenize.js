// Tokenise files with VS Code's TextMate engine (vscode-textmate + vscode-oniguruma) and the
// grammar in ../syntaxes: prints [{file, tokens: [[line, start, end, scope], ...]}] as JSON,
// the innermost scope of each token. tests/test_editors.py checks it against the compiler's lexer.
"use strict";

const fs = require("fs");
const path = require("path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

async function main(files) {
  const wasm = fs.readFileSync(path.join(path.dirname(require.resolve("vscode-oniguruma")), "onig.wasm")).buffer;
  await oniguruma.loadWASM(wasm);
  const registry = new vsctm.Registry({
    onigLib: Promise.resolve({ createOnigScanner: (p) => new oniguruma.OnigScanner(p), createOnigString: (s) => new oniguruma.OnigString(s) }),
    loadGrammar: async (scope) => {
      if (scope !== "source.cycle") return null;
      const file = path.join(__dirname, "..", "syntaxes", "cycle.tmLanguage.json");
      return vsctm.parseRawGrammar(fs.readFileSync(file, "utf8"), file);
    },
  });
  const grammar = await registry.loadGrammar("source.cycle");
  const out = [];
  for (const file of files) {
    const lines = fs.readFileSync(file, "utf8").split("\n");
    let stack = vsctm.INITIAL;
    const tokens = [];
    lines.forEach((line, i) => {
      const r = grammar.tokenizeLine(line, stack);
      for (const t of r.tokens) tokens.push([i + 1, t.startIndex, Math.min(t.endIndex, line.length), t.scopes[t.scopes.length - 1]]);
      stack = r.ruleStack;
    });
    out.push({ file, tokens });
  }
  process.stdout.write(JSON.stringify(out));
}

main(process.argv.slice(2)).catch((e) => { console.error(e); process.exit(1); });
