// Command kstatus prints what sigs.k8s.io/cli-utils' kstatus — the library Flux and kpt use
// to decide whether an applied object is ready — computes for each object on stdin.
//
//	kubectl get hrc cluster -o json | kstatus
//	{"status":"Current","message":"Resource is current"}
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	dec := json.NewDecoder(os.Stdin)
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus: input is not JSON:", err)
			os.Exit(2)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw); err != nil { // keeps integers as int64, as kstatus expects
			fmt.Fprintln(os.Stderr, "kstatus: not a Kubernetes object:", err)
			os.Exit(2)
		}
		res, err := status.Compute(obj)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kstatus:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(map[string]string{"status": res.Status.String(), "message": res.Message})
		fmt.Println(string(out))
	}
}
