package configs

import "embed"

// Clusters holds the cluster descriptions titan plan predicts for, one
// file each under clusters/ (see internal/cluster).
//
//go:embed clusters/*.toml
var Clusters embed.FS
