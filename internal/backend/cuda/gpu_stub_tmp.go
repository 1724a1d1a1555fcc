package cuda

// Open is replaced by gpu.go.
func Open(ordinal int, opt Options) (*Backend, error) { return nil, ErrNoGPU }
