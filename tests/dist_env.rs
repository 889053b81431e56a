//! The job layout each launcher's environment describes: torchrun (and
//! `asrforge launch`), SLURM's srun, Open MPI's mpirun; bad values name the
//! variable and the value found.

use asrforge::train::dist::{dist_info_from, first_host, tasks_on_node, DistInfo, JobSource};

fn layout(pairs: &[(&str, &str)]) -> asrforge::Result<DistInfo> {
    let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    dist_info_from(&move |k: &str| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
}

fn err(pairs: &[(&str, &str)]) -> String {
    layout(pairs).unwrap_err().to_string()
}

#[test]
fn nothing_set_is_one_process() {
    assert_eq!(layout(&[]).unwrap(), DistInfo::single());
    let d = layout(&[("MASTER_PORT", "1234")]).unwrap();
    assert_eq!((d.world_size, d.master_port, d.source), (1, 1234, JobSource::Single));
}

#[test]
fn torchrun_variables() {
    let d = layout(&[
        ("RANK", "5"),
        ("LOCAL_RANK", "1"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("GROUP_RANK", "1"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29400"),
    ])
    .unwrap();
    let want = DistInfo {
        world_size: 8,
        rank: 5,
        local_rank: 1,
        master_addr: "node0".into(),
        master_port: 29400,
        local_world_size: 4,
        node_rank: 1,
        source: JobSource::Torchrun,
    };
    assert_eq!(d, want);
    // Without GROUP_RANK the node is rank / local world size: 6 / 4 = 1.
    let d = layout(&[("RANK", "6"), ("WORLD_SIZE", "8"), ("LOCAL_WORLD_SIZE", "4"), ("LOCAL_RANK", "2")]).unwrap();
    assert_eq!((d.node_rank, d.master_addr.as_str(), d.master_port), (1, "127.0.0.1", 29500));
}

#[test]
fn torchrun_wins_over_slurm_and_mpi() {
    let d = layout(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("SLURM_PROCID", "7"),
        ("SLURM_NTASKS", "16"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
    ])
    .unwrap();
    assert_eq!((d.rank, d.world_size, d.source), (1, 2, JobSource::Torchrun));
    let d = layout(&[("SLURM_PROCID", "7"), ("SLURM_NTASKS", "16"), ("SLURM_NODELIST", "n1"), ("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")])
        .unwrap();
    assert_eq!((d.rank, d.world_size, d.source), (7, 16, JobSource::Slurm));
    // SLURM_PROCID alone (e.g. inside an allocation, not under srun) is not a SLURM layout.
    assert_eq!(layout(&[("SLURM_PROCID", "0")]).unwrap(), DistInfo::single());
}

#[test]
fn slurm_variables() {
    let d = layout(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_NTASKS_PER_NODE", "4"),
        ("SLURM_JOB_NODELIST", "gpu[01-03,07],login1"),
    ])
    .unwrap();
    let want = DistInfo {
        world_size: 8,
        rank: 5,
        local_rank: 1,
        master_addr: "gpu01".into(),
        master_port: 29500,
        local_world_size: 4,
        node_rank: 1,
        source: JobSource::Slurm,
    };
    assert_eq!(d, want);
    // SLURM_TASKS_PER_NODE "3(x2),2" on node 2 → 2 tasks; MASTER_PORT and MASTER_ADDR are honoured.
    let d = layout(&[
        ("SLURM_PROCID", "7"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_TASKS_PER_NODE", "3(x2),2"),
        ("SLURM_NODELIST", "a[7-9]"),
        ("MASTER_PORT", "30000"),
    ])
    .unwrap();
    assert_eq!((d.local_world_size, d.master_addr.as_str(), d.master_port, d.node_rank), (2, "a7", 30000, 2));
    let d = layout(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_NODELIST", "a[7-9]"), ("MASTER_ADDR", "10.1.2.3")]).unwrap();
    assert_eq!(d.master_addr, "10.1.2.3");
}

#[test]
fn slurm_node_lists() {
    let cases = [
        ("gpu[01-03,07],login1", "gpu01"),
        ("node7", "node7"),
        ("node7,node8", "node7"),
        ("gpu[07,01-03]", "gpu07"),
        ("rack[2-3]-node[08-09]", "rack2-node08"),
        ("a[001]", "a001"),
        ("[5-6]x", "5x"),
        (" c1 ", "c1"),
    ];
    for (list, first) in cases {
        assert_eq!(first_host(list).as_deref(), Ok(first), "{list}");
    }
    for bad in ["gpu[01-03", "gpu]1", "gpu[]", "gpu[a-b]", "", ",n1", "g[1[2]]"] {
        assert!(first_host(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(tasks_on_node("4", 0), Ok(4));
    assert_eq!(tasks_on_node("2(x3),1", 2), Ok(2));
    assert_eq!(tasks_on_node("2(x3),1", 3), Ok(1));
    assert!(tasks_on_node("2(x3),1", 4).is_err());
    assert!(tasks_on_node("2(3)", 0).is_err());
}

#[test]
fn open_mpi_variables() {
    let d = layout(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "h0"),
    ])
    .unwrap();
    let want = DistInfo {
        world_size: 4,
        rank: 3,
        local_rank: 1,
        master_addr: "h0".into(),
        master_port: 29500,
        local_world_size: 2,
        node_rank: 1,
        source: JobSource::OpenMpi,
    };
    assert_eq!(d, want);
    let e = err(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]);
    assert!(e.starts_with("config key `MASTER_ADDR`: expected the rendezvous host"), "{e}");
    assert!(e.contains("found it unset"), "{e}");
}

#[test]
fn bad_values_name_the_variable_and_value() {
    assert_eq!(err(&[("RANK", "x"), ("WORLD_SIZE", "2")]), "config key `RANK`: environment variable: expected a non-negative integer, found \"x\"");
    assert_eq!(err(&[("WORLD_SIZE", "2"), ("RANK", "2")]), "config key `RANK`: expected 0 <= RANK < WORLD_SIZE, found RANK 2 of WORLD_SIZE 2");
    assert_eq!(
        err(&[("WORLD_SIZE", "4"), ("RANK", "1"), ("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")]),
        "config key `LOCAL_RANK`: expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE (2), found 2"
    );
    assert_eq!(
        err(&[("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "3")]),
        "config key `LOCAL_WORLD_SIZE`: expected 1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE (2), found 3"
    );
    assert_eq!(
        err(&[("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")]),
        "config key `MASTER_PORT`: environment variable: expected a non-negative integer, found \"70000\""
    );
    assert_eq!(
        err(&[("SLURM_PROCID", "-1"), ("SLURM_NTASKS", "2")]),
        "config key `SLURM_PROCID`: environment variable: expected a non-negative integer, found \"-1\""
    );
    assert_eq!(
        err(&[("SLURM_PROCID", "2"), ("SLURM_NTASKS", "2"), ("SLURM_NODELIST", "n1")]),
        "config key `SLURM_PROCID`: expected 0 <= SLURM_PROCID < SLURM_NTASKS, found SLURM_PROCID 2 of SLURM_NTASKS 2"
    );
    let e = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "gpu[01-")]);
    assert!(e.starts_with("config key `SLURM_JOB_NODELIST`:") && e.ends_with("found \"gpu[01-\""), "{e}");
    let e = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
    assert!(e.starts_with("config key `SLURM_JOB_NODELIST`:") && e.contains("MASTER_ADDR"), "{e}");
    let e = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_NODELIST", "n1"), ("SLURM_TASKS_PER_NODE", "2(x")]);
    assert!(e.starts_with("config key `SLURM_TASKS_PER_NODE`:") && e.ends_with("found \"2(x\""), "{e}");
    assert_eq!(
        err(&[("OMPI_COMM_WORLD_RANK", "1")]),
        "config key `OMPI_COMM_WORLD_SIZE`: environment variable: expected a non-negative integer (the number of processes), found it unset"
    );
    assert_eq!(
        err(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "0"), ("MASTER_ADDR", "h")]),
        "config key `OMPI_COMM_WORLD_RANK`: expected 0 <= OMPI_COMM_WORLD_RANK < OMPI_COMM_WORLD_SIZE, found OMPI_COMM_WORLD_RANK 0 of OMPI_COMM_WORLD_SIZE 0"
    );
}
