//go:build !cgo

// Package aggify needs cgo: its PL/pgSQL parser is pg_query_go
// (PostgreSQL's parser in C). Built with CGO_ENABLED=0 the package is
// empty, and titan aggify and titan analyze say so.
package aggify
