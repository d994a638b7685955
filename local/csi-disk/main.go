// dedup-csi-disk: the local cluster's stand-in for a cloud disk, a CSI driver of this
// project (issue 28, "Volumes through real CSI"; local/dedup_local/real_csi.py runs it).
//
// A disk is a directory under --disks (on this one host every node reaches it, as every
// node of a cloud zone reaches its disks) and a record beside it saying which node it
// is attached to. Like a cloud disk:
//   - it is attached to one node at a time: ControllerPublishVolume for another node
//     fails (FAILED_PRECONDITION) until ControllerUnpublishVolume detached it;
//   - a node can only stage (mount) a disk attached to it;
//   - an attached disk cannot be deleted;
//   - no topology: any node can attach any disk.
//
// --mode=controller serves Identity + Controller on --endpoint (for csi-provisioner and
// csi-attacher). --mode=node serves Identity + Node on --endpoint for the kubelet, and
// the kubelet's plugin registration API (pluginregistration.k8s.io v1) on
// --registration-socket, which is what node-driver-registrar would do.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

var version = "dev"

type config struct {
	name, mode, endpoint, disks, nodeID, registration string
}

// record is what the disk's JSON file beside its directory holds.
type record struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Capacity int64  `json:"capacity"`
	Node     string `json:"node,omitempty"` // attached to; empty when detached
	ReadOnly bool   `json:"readOnly,omitempty"`
}

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	registerapi.UnimplementedRegistrationServer
	cfg config
	mu  sync.Mutex // one request at a time in this process; flock across processes
}

func main() {
	var cfg config
	flag.StringVar(&cfg.name, "driver-name", "disk.dedup.local", "the CSI driver's name")
	flag.StringVar(&cfg.mode, "mode", "", "controller or node")
	flag.StringVar(&cfg.endpoint, "endpoint", "", "the CSI socket to serve (a path)")
	flag.StringVar(&cfg.disks, "disks", "", "the directory of the disks (every node reaches it)")
	flag.StringVar(&cfg.nodeID, "node-id", "", "node mode: this node's name")
	flag.StringVar(&cfg.registration, "registration-socket", "", "node mode: the kubelet plugin registration socket to serve")
	flag.Parse()
	if cfg.endpoint == "" || cfg.disks == "" || (cfg.mode != "controller" && cfg.mode != "node") {
		log.Fatal("--mode=controller|node, --endpoint and --disks are required")
	}
	if cfg.mode == "node" && (cfg.nodeID == "" || cfg.registration == "") {
		log.Fatal("--mode=node needs --node-id and --registration-socket")
	}
	if err := os.MkdirAll(cfg.disks, 0o755); err != nil {
		log.Fatal(err)
	}
	d := &driver{cfg: cfg}
	servers := []*grpc.Server{d.serve(cfg.endpoint, func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, d)
		if cfg.mode == "controller" {
			csi.RegisterControllerServer(s, d)
		} else {
			csi.RegisterNodeServer(s, d)
		}
	})}
	if cfg.mode == "node" {
		servers = append(servers, d.serve(cfg.registration, func(s *grpc.Server) {
			registerapi.RegisterRegistrationServer(s, d)
		}))
	}
	log.Printf("%s %s (%s) serving %s", cfg.name, version, cfg.mode, cfg.endpoint)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	for _, s := range servers {
		s.Stop()
	}
	os.Remove(cfg.endpoint)
	if cfg.registration != "" {
		os.Remove(cfg.registration)
	}
}

func (d *driver) serve(path string, register func(*grpc.Server)) *grpc.Server {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		log.Fatal(err)
	}
	os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(d.logged))
	register(s)
	go func() {
		if err := s.Serve(listener); err != nil {
			log.Fatalf("serving %s: %v", path, err)
		}
	}()
	return s
}

func (d *driver) logged(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resp, err := handler(ctx, req)
	if !strings.HasSuffix(info.FullMethod, "/Probe") {
		log.Printf("%s %v -> err=%v", info.FullMethod, req, err)
	}
	return resp, err
}

// ---------------------------------------------------------------- the disks' records

// locked runs fn holding the disks directory's lock (other processes: the nodes).
func (d *driver) locked(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(d.cfg.disks, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return fn()
}

func (d *driver) recordPath(id string) string { return filepath.Join(d.cfg.disks, id+".json") }
func (d *driver) dataPath(id string) string   { return filepath.Join(d.cfg.disks, id) }

// load returns the disk's record, or nil when there is no such disk.
func (d *driver) load(id string) (*record, error) {
	if id == "" || strings.ContainsAny(id, "/.") {
		return nil, status.Error(codes.InvalidArgument, "volume_id missing or malformed")
	}
	data, err := os.ReadFile(d.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &r, nil
}

func (d *driver) save(r *record) error {
	data, _ := json.Marshal(r)
	tmp := d.recordPath(r.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := os.Rename(tmp, d.recordPath(r.ID)); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// singleNode: the access modes a disk that attaches to one node at a time supports.
func singleNode(caps []*csi.VolumeCapability) error {
	for _, c := range caps {
		if c.GetMount() == nil {
			return status.Error(codes.InvalidArgument, "only filesystem (mount) volumes")
		}
		switch c.GetAccessMode().GetMode() {
		case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		default:
			return status.Errorf(codes.InvalidArgument, "access mode %v: a disk attaches to one node", c.GetAccessMode().GetMode())
		}
	}
	return nil
}

// ---------------------------------------------------------------- identity

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.name, VendorVersion: version}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	// No VOLUME_ACCESSIBILITY_CONSTRAINTS: no topology, any node attaches any disk.
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// ---------------------------------------------------------------- controller

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *driver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name missing")
	}
	if err := singleNode(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "no snapshots or clones")
	}
	sum := sha256.Sum256([]byte(req.GetName()))
	id := "disk-" + hex.EncodeToString(sum[:8])
	capacity := req.GetCapacityRange().GetRequiredBytes()
	var out *record
	err := d.locked(func() error {
		r, err := d.load(id)
		if err != nil {
			return err
		}
		if r != nil { // idempotent: the same name made it before
			if r.Capacity < capacity {
				return status.Errorf(codes.AlreadyExists, "disk %s exists with %d bytes", id, r.Capacity)
			}
			out = r
			return nil
		}
		if err := os.MkdirAll(d.dataPath(id), 0o777); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		out = &record{ID: id, Name: req.GetName(), Capacity: capacity}
		return d.save(out)
	})
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: out.ID, CapacityBytes: out.Capacity}}, nil
}

func (d *driver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	err := d.locked(func() error {
		r, err := d.load(req.GetVolumeId())
		if err != nil || r == nil {
			return err // gone already: done
		}
		if r.Node != "" {
			return status.Errorf(codes.FailedPrecondition, "disk %s is attached to node %s", r.ID, r.Node)
		}
		if err := os.RemoveAll(d.dataPath(r.ID)); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		return os.Remove(d.recordPath(r.ID))
	})
	if err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *driver) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetNodeId() == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "node_id and volume_capability are required")
	}
	if err := singleNode([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	err := d.locked(func() error {
		r, err := d.load(req.GetVolumeId())
		if err != nil {
			return err
		}
		if r == nil {
			return status.Errorf(codes.NotFound, "no disk %s", req.GetVolumeId())
		}
		switch {
		case r.Node == req.GetNodeId() && r.ReadOnly == req.GetReadonly():
			return nil // attached there already
		case r.Node == req.GetNodeId():
			return status.Errorf(codes.AlreadyExists, "disk %s is attached to node %s with readOnly=%v", r.ID, r.Node, r.ReadOnly)
		case r.Node != "":
			// What a cloud disk answers: attached elsewhere, detach it first.
			return status.Errorf(codes.FailedPrecondition, "disk %s is attached to node %s: it attaches to one node at a time", r.ID, r.Node)
		}
		r.Node, r.ReadOnly = req.GetNodeId(), req.GetReadonly()
		return d.save(r)
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"attachedTo": req.GetNodeId()}}, nil
}

func (d *driver) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	err := d.locked(func() error {
		r, err := d.load(req.GetVolumeId())
		if err != nil || r == nil {
			return err // no disk: nothing attached
		}
		if r.Node == "" || (req.GetNodeId() != "" && r.Node != req.GetNodeId()) {
			return nil // not attached to that node: detached already
		}
		r.Node, r.ReadOnly = "", false
		return d.save(r)
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (d *driver) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	r, err := d.load(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "no disk %s", req.GetVolumeId())
	}
	if err := singleNode(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeCapabilities: req.GetVolumeCapabilities()}}, nil
}

// ---------------------------------------------------------------- node

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.cfg.nodeID}, nil
}

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{
			Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
	}}}, nil
}

// NodeStageVolume mounts the disk at the staging path, as a node mounts the block device
// of a disk attached to it; a disk attached elsewhere (or nowhere) is not there to mount.
func (d *driver) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	target := req.GetStagingTargetPath()
	if target == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "staging_target_path and volume_capability are required")
	}
	var r *record
	err := d.locked(func() (err error) { r, err = d.load(req.GetVolumeId()); return err })
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "no disk %s", req.GetVolumeId())
	}
	if r.Node != d.cfg.nodeID {
		return nil, status.Errorf(codes.FailedPrecondition, "disk %s is not attached to node %s (attached to %q)", r.ID, d.cfg.nodeID, r.Node)
	}
	if err := bindMount(d.dataPath(r.ID), target, r.ReadOnly); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (d *driver) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := unmount(req.GetStagingTargetPath(), false); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	staging, target := req.GetStagingTargetPath(), req.GetTargetPath()
	if staging == "" || target == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "staging_target_path, target_path and volume_capability are required")
	}
	if mounted, err := isMountPoint(staging); err != nil || !mounted {
		return nil, status.Errorf(codes.FailedPrecondition, "disk %s is not staged at %s", req.GetVolumeId(), staging)
	}
	if err := bindMount(staging, target, req.GetReadonly()); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := unmount(req.GetTargetPath(), true); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// ---------------------------------------------------------------- kubelet registration

func (d *driver) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type: registerapi.CSIPlugin, Name: d.cfg.name, Endpoint: d.cfg.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (d *driver) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Printf("the kubelet did not register the driver: %s", s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// ---------------------------------------------------------------- mounts

func isMountPoint(path string) (bool, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	clean := filepath.Clean(path)
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && strings.ReplaceAll(fields[4], `\040`, " ") == clean {
			return true, nil
		}
	}
	return false, nil
}

// bindMount mounts source at target (made if missing); done already is success.
func bindMount(source, target string, readOnly bool) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted, err := isMountPoint(target); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if mounted {
		return nil
	}
	if err := syscall.Mount(source, target, "", syscall.MS_BIND, ""); err != nil {
		return status.Errorf(codes.Internal, "mount --bind %s %s: %v", source, target, err)
	}
	if readOnly {
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", target, "", flags, ""); err != nil {
			_ = syscall.Unmount(target, 0)
			return status.Errorf(codes.Internal, "remount read-only %s: %v", target, err)
		}
	}
	return nil
}

// unmount unmounts path if it is mounted and, with remove, deletes the directory.
func unmount(path string, remove bool) error {
	if path == "" {
		return status.Error(codes.InvalidArgument, "target path missing")
	}
	mounted, err := isMountPoint(path)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if err := syscall.Unmount(path, 0); err != nil {
			return status.Error(codes.Internal, fmt.Sprintf("umount %s: %v", path, err))
		}
	}
	if remove {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return status.Error(codes.Internal, err.Error())
		}
	}
	return nil
}
