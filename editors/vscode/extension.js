// The cyclelang extension: starts `cyclec lsp` (the setting cyclelang.server.command) and
// hands .cycle documents to it. Everything else (diagnostics, hover, completion, go to
// definition, symbols, formatting, quick fixes) is the server's.
"use strict";

const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("cyclelang").get("server.command", ["cyclec", "lsp"]);
  const serverOptions = { command, args, transport: TransportKind.stdio };
  const clientOptions = {
    documentSelector: [{ scheme: "file", language: "cycle" }, { scheme: "untitled", language: "cycle" }],
    synchronize: { fileEvents: vscode.workspace.createFileSystemWatcher("**/*.cycle") },
  };
  client = new LanguageClient("cyclelang", "cyclelang (cyclec lsp)", serverOptions, clientOptions);
  context.subscriptions.push({ dispose: () => client && client.stop() });
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
