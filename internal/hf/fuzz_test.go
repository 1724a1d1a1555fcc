package hf

import (
	"testing"
)

// FuzzParseConfig feeds arbitrary bytes to ParseConfig and Llama, then
// lays out an accepted model: nothing may panic, hang or allocate
// without bound (the sizes are held to Limits). The seeds run in the
// normal suite.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(llama31_8B))
	f.Add([]byte(`{"model_type":"llama","hidden_size":64,"intermediate_size":172,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":64,"intermediate_size":172,"num_hidden_layers":1000000000,"num_attention_heads":4,"vocab_size":1000000000000}`))
	f.Add([]byte(`{"model_type":"llama","rope_scaling":{"rope_type":"llama3","factor":-1},"bos_token_id":[1,2],"eos_token_id":null}`))
	f.Add([]byte(`{"rope_parameters":{"rope_theta":1e308,"rope_type":"default"}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		mc, err := ParseConfig(data)
		if err != nil {
			return
		}
		cfg, err := mc.Llama()
		if err != nil {
			return
		}
		layout := cfg.Layout()
		if len(layout) > 9*Limits.Layers+3 {
			t.Fatalf("%d tensors from %d layers", len(layout), cfg.NLayers)
		}
		_ = cfg.NumParams()
		_ = NewModelConfig(cfg, "float32", ExportOptions{})
	})
}
