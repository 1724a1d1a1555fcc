//go:build !cgo

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// errNoCgo is what titan aggify and titan analyze say in a binary built
// with CGO_ENABLED=0: their PL/pgSQL parser (pg_query_go, PostgreSQL's own
// parser) is C.
var errNoCgo = errors.New("titan was built without cgo (CGO_ENABLED=0): aggify's PL/pgSQL parser (pg_query_go, PostgreSQL's parser in C) needs CGO_ENABLED=1")

func newAggifyCmd() *cobra.Command {
	return &cobra.Command{Use: "aggify FILE.sql", Short: "Rewrite cursor loops into custom aggregates (needs a cgo build)",
		Example: "  titan aggify loss_ema", RunE: func(*cobra.Command, []string) error { return errNoCgo }}
}

func newAnalyzeCmd() *cobra.Command {
	return &cobra.Command{Use: "analyze FILE.sql [ARG...]", Short: "Run an analysis over the run store (needs a cgo build)",
		Example: "  titan analyze leaderboard", RunE: func(*cobra.Command, []string) error { return errNoCgo }}
}
