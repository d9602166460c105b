"""A two-agent CrewAI crew: a researcher's task, then a writer's, run in order on the platform's model."""

from __future__ import annotations

from crewai import Agent, Crew, Process, Task

researcher = Agent(role="researcher", goal="Find the facts", backstory="You research the weather.")
writer = Agent(role="writer", goal="Write one line", backstory="You write briefly.")
hosted = Crew(
    agents=[researcher, writer],
    tasks=[
        Task(description="Research the weather in {message}.", expected_output="Notes", agent=researcher),
        Task(description="Write one line about the weather in {message}.", expected_output="A line", agent=writer),
    ],
    process=Process.sequential,
)
