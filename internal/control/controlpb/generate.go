// Package controlpb holds the protocol buffer messages and gRPC stubs of the
// titan control plane. The Go files are generated from control.proto and
// committed, so building titan never needs protoc.
package controlpb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative control.proto
