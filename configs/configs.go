// Package configs embeds titan's model flavor files, so that the binary
// carries the published model shapes with no files next to it.
package configs

import "embed"

// FS holds the flavor files, one TOML table per flavor: llama3.toml and
// hyena.toml.
//
//go:embed *.toml
var FS embed.FS
